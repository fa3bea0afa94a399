"""Layer planning: which recipe each layer of a model trains under. `PrecisionPlan` (plan.py) holds one
`LayerPlan` per layer (its choice, the reason and the evidence), prints as a table, plots, and saves as editable
JSON; `fp8mp.convert(model, plan=plan)` applies one. May import every layer below it (fp8mp.utils up to fp8mp.nn),
never fp8mp.training or fp8mp.integrations."""
from fp8mp.planning.plan import CANDIDATE_NAMES, HIGH_PRECISION, LayerPlan, PrecisionPlan, as_plan, default_candidates
from fp8mp.planning.plan_precision import plan_precision
from fp8mp.planning.replan import replan

__all__ = ["CANDIDATE_NAMES", "HIGH_PRECISION", "LayerPlan", "PrecisionPlan", "as_plan", "default_candidates",
           "plan_precision", "replan"]

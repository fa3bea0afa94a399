"""Threads sharing a model: fp8_autocast and fp8_model_init are per thread, and FP8 scaling updates of
one module do not interleave. Each threaded run must equal the same calls made one after the other."""
from __future__ import annotations

import copy
import threading

import pytest
import torch

import fp8mp
from fp8mp.scaling.autocast import take_unchecked_modules
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

CALLS = 24


def run_in_threads(*targets):
    """Start every target at once (a barrier), join them, re-raise the first exception."""
    barrier, errors = threading.Barrier(len(targets)), []

    def wrap(target):
        def run():
            try:
                barrier.wait()
                target()
            except BaseException as error:  # noqa: BLE001 (re-raised in the main thread)
                errors.append(error)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_fp8_autocast_state_is_per_thread():
    inside, checked = threading.Event(), threading.Event()
    seen = {}

    def fp8_thread():
        with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
            inside.set()
            checked.wait(timeout=30)
            seen["own"] = (fp8mp.is_fp8_enabled(), type(fp8mp.get_fp8_recipe()))

    thread = threading.Thread(target=fp8_thread)
    thread.start()
    assert inside.wait(timeout=30)
    seen["other"] = (fp8mp.is_fp8_enabled(), fp8mp.get_fp8_recipe())  # while the other thread is inside
    with fp8mp.fp8_autocast(enabled=False):
        seen["nested"] = fp8mp.is_fp8_enabled()
    checked.set()
    thread.join()
    assert seen == {"other": (False, None), "nested": False, "own": (True, CurrentScaling)}


def test_fp8_model_init_is_per_thread():
    inside, built = threading.Event(), threading.Event()
    layers = {}

    def init_thread():
        with fp8mp.fp8_model_init():
            inside.set()
            built.wait(timeout=30)
            layers["inside"] = fp8mp.nn.Linear(16, 16)

    thread = threading.Thread(target=init_thread)
    thread.start()
    assert inside.wait(timeout=30)
    layers["other"] = fp8mp.nn.Linear(16, 16)
    built.set()
    thread.join()
    assert layers["inside"].stores_fp8_weight and not layers["other"].stores_fp8_weight


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)))


def inputs(seed: int, count: int = CALLS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(128, 64, generator=gen) * (1 + i % 5) for i in range(count)]


def calls(model, xs, recipe, results):
    """Forward and input gradient of each x, in FP8 with `recipe` (None: out of FP8)."""
    def run():
        for x in xs:
            x = x.clone().requires_grad_()
            with fp8mp.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
                out = model(x)
            (grad,) = torch.autograd.grad(out.square().sum(), x)
            results.append((out.detach(), grad))
    return run


def assert_same(got, expected):
    assert len(got) == len(expected)
    for i, ((out, grad), (out_ref, grad_ref)) in enumerate(zip(got, expected)):
        assert torch.equal(out, out_ref) and torch.equal(grad, grad_ref), f"call {i} differs"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_one_model_in_and_out_of_fp8_in_two_threads_at_once_equals_serial(compiled):
    prepare = (lambda m: torch.compile(m, fullgraph=True, backend="aot_eager")) if compiled else (lambda m: m)
    recipe = DelayedScaling(amax_history_len=4)
    serial_model, threaded_model = make_model(), make_model()
    serial_prepared, threaded_prepared = prepare(serial_model), prepare(threaded_model)
    # Compile every graph in this thread first, the same calls for both models so that their scaling state
    # stays equal. Dynamo cannot compile in one thread while another runs a compiled module (make_fx patches
    # nn.Module.__call__ process-wide: "Detected that you are using FX to symbolically trace a dynamo-optimized
    # function", torch 2.11 and 2.12), and torch 2.11 crashes compiling outside the main thread. The guards see
    # the per-thread list of modules the loss scaler has still to check (empty in a new thread, and its length),
    # so each warm-up starts from an empty one, as a new thread does; and twice, because a model's first FP8
    # call compiles with the amax history at its default length (the recipe sets it during that call).
    # What this test is about is fp8mp's state under threads running the model; compiling is torch's business.
    for _ in range(2):
        for model in (serial_prepared, threaded_prepared):
            for xs, warm_recipe in ((inputs(3, 2), recipe), (inputs(4, 2), None)):
                take_unchecked_modules()
                calls(model, xs, warm_recipe, [])()
    take_unchecked_modules()
    serial = {"fp8": [], "high": []}
    calls(serial_prepared, inputs(1), recipe, serial["fp8"])()
    calls(serial_prepared, inputs(2), None, serial["high"])()
    threaded = {"fp8": [], "high": []}
    run_in_threads(calls(threaded_prepared, inputs(1), recipe, threaded["fp8"]),
                   calls(threaded_prepared, inputs(2), None, threaded["high"]))
    assert_same(threaded["fp8"], serial["fp8"])
    assert_same(threaded["high"], serial["high"])
    for a, b in zip(threaded_model.modules(), serial_model.modules()):  # the same scaling history
        if isinstance(a, fp8mp.nn.Linear):
            assert torch.equal(a.fp8_meta.amax_history, b.fp8_meta.amax_history)


def test_two_fp8_threads_on_one_model_do_not_interleave_scale_updates_and_casts():
    # Under current scaling each call's scales come from its own input and gradient, so the results do
    # not depend on the order of the calls: two threads must get what each gets alone. Without the
    # module's lock one thread casts with the scale the other just set.
    recipe = CurrentScaling()
    model = make_model()
    alone = {1: [], 2: []}
    for seed in alone:
        calls(model, inputs(seed, 4 * CALLS), recipe, alone[seed])()
    together = {1: [], 2: []}
    run_in_threads(*(calls(model, inputs(seed, 4 * CALLS), recipe, together[seed]) for seed in together))
    for seed in alone:
        assert_same(together[seed], alone[seed])


def test_a_copied_or_pickled_module_gets_its_own_lock():
    layer = fp8mp.nn.Linear(16, 16)
    clone = copy.deepcopy(layer)
    assert clone.fp8_meta._lock is not layer.fp8_meta._lock
    with clone.fp8_meta.lock():
        assert layer.fp8_meta._lock.acquire(blocking=False)
        layer.fp8_meta._lock.release()


# ---------------------------------------------------------------------------------------- the module's lock
class SpyLock:
    """Stands in for an Fp8Meta's lock: records each attempt to take it (then takes the real one)."""

    def __init__(self, real):
        self.real, self.attempted = real, threading.Event()

    def __enter__(self):
        self.attempted.set()
        return self.real.__enter__()

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)


def frozen_fp8_weight_linear(recipe):
    """A Linear whose weight is stored in FP8 for `recipe`, frozen: it trains without a master weight (its
    input still gets gradients)."""
    with fp8mp.fp8_model_init(recipe=recipe):
        layer = fp8mp.nn.Linear(32, 16)
    layer.freeze_weight()
    return layer


# name -> a module built for a recipe (which only FP8-stored weights depend on)
FP8_MODULES = {
    "Linear": lambda recipe: fp8mp.nn.Linear(32, 16),
    "Linear(fp8 weight)": frozen_fp8_weight_linear,
    "Conv1D": lambda recipe: fp8mp.nn.Conv1D(16, 32),
    "LayerNormLinear": lambda recipe: fp8mp.nn.LayerNormLinear(32, 16),
    "LayerNormLinear(RMSNorm)": lambda recipe: fp8mp.nn.LayerNormLinear(32, 16, normalization="RMSNorm"),
    "LoRALinear": lambda recipe: fp8mp.nn.LoRALinear(fp8mp.nn.Linear(32, 16), rank=4, alpha=8.0),
    "LoRALinear(fp8 base)": lambda recipe: fp8mp.nn.LoRALinear(fp8mp.nn.Linear(32, 16), rank=4, alpha=8.0,
                                                                fp8_base_weight=True, fp8_base_recipe=recipe),
}
PER_TENSOR = {"delayed": DelayedScaling, "current": CurrentScaling}
FINE_GRAINED = {"rowwise": fp8mp.recipe.RowwiseScaling, "block": fp8mp.recipe.BlockScaling,
                "mxfp8": fp8mp.recipe.MXFP8Scaling}


def scaling_state(module):
    """The Fp8Meta of the FP8 Linear (or Conv1D) inside `module`: the state its lock guards."""
    metas = [m.fp8_meta for m in module.modules() if hasattr(m, "fp8_meta")]
    assert len(metas) == 1, type(module).__name__
    return metas[0]


@pytest.fixture
def spy_on_lock():
    """spy(meta): put a SpyLock in place of `meta`'s lock (before the forward whose backward is to be watched:
    the autograd functions keep the lock they got in forward); the real locks are put back afterwards."""
    spied = []

    def spy(meta) -> SpyLock:
        spied.append((meta, meta._lock))
        meta._lock = SpyLock(meta._lock)
        return meta._lock

    yield spy
    for meta, real in spied:
        meta._lock = real


def assert_waits_for_the_lock(spy: SpyLock, call) -> None:
    """Hold the spied lock here, run `call` in another thread: it must ask for the lock and wait (not finish)
    while it is held, then finish once it is released. Deterministic: nothing depends on how long anything takes."""
    spy.attempted.clear()
    finished, errors = threading.Event(), []

    def run():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(error)
        finally:
            finished.set()

    worker = threading.Thread(target=run)
    with spy.real:
        worker.start()
        for _ in range(600):  # until the worker asks for the lock or finishes without it (60 s at most)
            if spy.attempted.wait(0.1) or finished.is_set():
                break
        assert spy.attempted.is_set(), "the call did not take the module's lock"
        assert not finished.is_set() and worker.is_alive(), "the call finished while the lock was held"
    worker.join(timeout=120)
    assert finished.is_set(), "the call did not finish after the lock was released"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("recipe", [*PER_TENSOR, *FINE_GRAINED])
@pytest.mark.parametrize("module", FP8_MODULES)
@pytest.mark.parametrize("step", ["first", "later"])
def test_each_fp8_module_forward_waits_for_its_lock(module, recipe, step, spy_on_lock):
    torch.manual_seed(0)
    make_recipe = {**PER_TENSOR, **FINE_GRAINED}[recipe]
    layer = FP8_MODULES[module](make_recipe())
    x = torch.randn(8, 32)
    if step == "later":  # delayed scaling's scale update and the fused LayerNormLinear run from the second step
        with fp8mp.fp8_autocast(fp8_recipe=make_recipe()):
            layer(x)

    def forward():
        with fp8mp.fp8_autocast(fp8_recipe=make_recipe()):  # fp8_autocast is per thread: entered in the caller's
            layer(x)

    assert_waits_for_the_lock(spy_on_lock(scaling_state(layer)), forward)


@pytest.mark.parametrize("recipe", PER_TENSOR)
@pytest.mark.parametrize("module", FP8_MODULES)
@pytest.mark.parametrize("step", ["first", "later"])
def test_each_fp8_module_backward_waits_for_its_lock(module, recipe, step, spy_on_lock):
    """Per-tensor recipes update the gradient's scale in backward (fine-grained ones keep no state there)."""
    torch.manual_seed(0)
    layer = FP8_MODULES[module](PER_TENSOR[recipe]())
    x = torch.randn(8, 32, requires_grad=True)
    spy = spy_on_lock(scaling_state(layer))
    for _ in range(2 if step == "later" else 1):
        with fp8mp.fp8_autocast(fp8_recipe=PER_TENSOR[recipe]()):
            out = layer(x)
    assert_waits_for_the_lock(spy, lambda: out.square().sum().backward())
    assert x.grad is not None and bool(x.grad.isfinite().all())


@pytest.mark.parametrize("recipe", PER_TENSOR)
def test_grouped_linear_forward_and_backward_wait_for_its_lock(recipe, spy_on_lock):
    """fp8mp.nn.GroupedLinear takes its groups with the input, so it is not among FP8_MODULES' one-argument calls."""
    torch.manual_seed(0)
    layer, splits = fp8mp.nn.GroupedLinear(3, 32, 16), [3, 0, 5]
    x = torch.randn(8, 32, requires_grad=True)
    spy = spy_on_lock(layer.fp8_meta)

    def forward():
        with fp8mp.fp8_autocast(fp8_recipe=PER_TENSOR[recipe]()):
            return layer(x, splits)

    assert_waits_for_the_lock(spy, forward)
    out = forward()
    assert_waits_for_the_lock(spy, lambda: out.square().sum().backward())
    assert x.grad is not None and bool(x.grad.isfinite().all())

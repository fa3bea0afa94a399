"""The public module paths name the objects their layers define: the short paths (fp8mp.recipe, ...), the
optimizer pieces under fp8mp.optim and fp8mp.training, and the paths of modules from before they moved."""
from __future__ import annotations

import importlib

import pytest
import torch

import fp8mp

SHORT_PATHS = {"fp8mp.recipe": "fp8mp.scaling.recipe", "fp8mp.monitor": "fp8mp.training.monitor",
               "fp8mp.fallback": "fp8mp.training.fallback", "fp8mp.amp": "fp8mp.training.loss_scaler",
               "fp8mp.distributed": "fp8mp.scaling.distributed",
               "fp8mp.nn.saved_activations": "fp8mp.memory.saved_activations",
               "fp8mp.training.saved_tensors": "fp8mp.memory.saved_tensors"}


@pytest.mark.parametrize("path", sorted(SHORT_PATHS))
def test_a_short_path_gives_the_same_objects(path):
    short, home = importlib.import_module(path), importlib.import_module(SHORT_PATHS[path])
    assert short.__all__ == home.__all__
    assert [name for name in home.__all__ if getattr(short, name) is not getattr(home, name)] == []
    name = path.rpartition(".")[2]
    if path.count(".") == 1:  # reached as an attribute after `import fp8mp` alone, too
        assert getattr(fp8mp, name) is short


def test_the_documented_forms_of_the_short_paths():
    from fp8mp.recipe import DelayedScaling
    import fp8mp.scaling.recipe
    assert fp8mp.recipe.DelayedScaling is DelayedScaling is fp8mp.scaling.recipe.DelayedScaling
    assert fp8mp.amp.LossScaler is fp8mp.LossScaler is fp8mp.training.LossScaler


def test_the_optimizer_pieces_are_one_set_of_objects():
    from fp8mp.optim.master_weights import MasterWeightOptimizer
    from fp8mp.optim.step_in_backward import StepInBackward, step_in_backward
    assert fp8mp.optim.MasterWeightOptimizer is fp8mp.training.MasterWeightOptimizer is MasterWeightOptimizer
    assert fp8mp.step_in_backward is fp8mp.optim.step_in_backward is fp8mp.training.step_in_backward is step_in_backward
    assert fp8mp.optim.StepInBackward is fp8mp.training.StepInBackward is StepInBackward
    assert fp8mp.training.master_weight_optimizer.MasterWeightOptimizer is MasterWeightOptimizer
    assert fp8mp.training.distributed_checkpoint.save_checkpoint is fp8mp.parallel.save_checkpoint


def test_the_memory_levers_keep_their_nn_names():
    import fp8mp.memory
    names = ("chunked_linear_cross_entropy", "embedding_grad_in_row_blocks", "restore_embedding_grad", "fp8_recompute")
    for name in names:
        assert getattr(fp8mp.nn, name) is getattr(fp8mp.memory, name), name


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without torch.distributed")
def test_the_tensor_parallel_styles_keep_their_nn_path():
    from fp8mp.nn.tensor_parallel import Fp8ColwiseParallel, Fp8RowwiseParallel
    from fp8mp.parallel import tensor_parallel
    assert Fp8ColwiseParallel is tensor_parallel.Fp8ColwiseParallel
    assert Fp8RowwiseParallel is tensor_parallel.Fp8RowwiseParallel

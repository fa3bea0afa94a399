"""Layer 4, the training system: loss scaling, the optimizer step in backward, the FP32 master-weight optimizer, precision
fallback, the numerics monitor (and its plots), Trainer and its config, checkpoints through torch.distributed.checkpoint.
May import every layer below."""
from fp8mp.training import distributed_checkpoint, fallback, loss_scaler, master_weight_optimizer, monitor
from fp8mp.training.distributed_checkpoint import TrainingState, load_checkpoint, save_checkpoint
from fp8mp.training.loss_scaler import LossScaler
from fp8mp.training.master_weight_optimizer import MasterWeightOptimizer
from fp8mp.training.in_backward_step import StepInBackward, step_in_backward
from fp8mp.training.trainer import Trainer
from fp8mp.training.trainer_config import TrainerConfig

__all__ = ["distributed_checkpoint", "fallback", "loss_scaler", "master_weight_optimizer", "monitor", "LossScaler",
           "MasterWeightOptimizer", "Trainer", "TrainerConfig", "StepInBackward", "step_in_backward", "TrainingState",
           "save_checkpoint", "load_checkpoint"]

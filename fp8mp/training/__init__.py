"""Layer training, the training system: loss scaling, precision fallback, the numerics monitor (and its plots),
Trainer and its config, crash-safe checkpoint folders. Re-exports the optimizer step in backward and the FP32
master-weight optimizer (fp8mp.optim) and the checkpoints through torch.distributed.checkpoint (fp8mp.parallel)
under their names here. May import every layer below."""
from fp8mp.optim import master_weights as master_weight_optimizer  # the module's name before it moved to fp8mp.optim
from fp8mp.optim.master_weights import MasterWeightOptimizer
from fp8mp.optim.step_in_backward import StepInBackward, step_in_backward
from fp8mp.parallel import distributed_checkpoint
from fp8mp.parallel.distributed_checkpoint import TrainingState, load_checkpoint, save_checkpoint
from fp8mp.training import fallback, loss_scaler, monitor
from fp8mp.training.loss_scaler import LossScaler
from fp8mp.training.trainer import Trainer
from fp8mp.training.trainer_config import TrainerConfig

__all__ = ["distributed_checkpoint", "fallback", "loss_scaler", "master_weight_optimizer", "monitor", "LossScaler",
           "MasterWeightOptimizer", "Trainer", "TrainerConfig", "StepInBackward", "step_in_backward", "TrainingState",
           "save_checkpoint", "load_checkpoint"]

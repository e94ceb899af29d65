"""hybridnet.optim: SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta and lr_scheduler."""

from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

"""hybridnet.nn: Module, Parameter, layers and losses (PyTorch names and defaults)."""

from . import functional, init
from .layers import (
                     GELU,
                     BCEWithLogitsLoss,
                     CrossEntropyLoss,
                     Dropout,
                     Embedding,
                     Flatten,
                     Identity,
                     L1Loss,
                     LayerNorm,
                     Linear,
                     LogSoftmax,
                     MSELoss,
                     NLLLoss,
                     ReLU,
                     Sigmoid,
                     SiLU,
                     Softmax,
                     Tanh,
)
from .module import Module, ModuleDict, ModuleList, Sequential
from .parameter import Parameter
from .rnn import GRUCell, LSTMCell, RNNCell
from .rnn_seq import GRU, LSTM, RNN

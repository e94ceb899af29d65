"""hybridnet.nn: Module, Parameter, layers and losses (PyTorch names and defaults)."""

from . import functional, init, utils
from .conv_layers import (
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    MaxPool1d,
    MaxPool2d,
)
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
from .loss_modules import BCELoss, CosineSimilarity, HuberLoss, KLDivLoss, SmoothL1Loss
from .module import Module, ModuleDict, ModuleList, Sequential
from .parameter import Parameter
from .rnn import GRUCell, LSTMCell, RNNCell
from .rnn_seq import GRU, LSTM, RNN
from .transformer import (
    Dropout2d,
    MultiheadAttention,
    TransformerEncoder,
    TransformerEncoderLayer,
)

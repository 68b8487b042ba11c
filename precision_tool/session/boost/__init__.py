"""mindspore.boost in the training session: levels O0/O1/O2, LessBN, GradientFreeze, GradientAccumulation,
AdaSum, DimReduce and GroupLossScaleManager, one module each (docs/boost.md).

    Session(SessionConfig(model="cnn", boost_level="O2")).run()
"""

from precision_tool.session.boost.config import (ALGORITHMS, BOOST_LEVELS, BOOST_MODES, DEFAULTS, BoostConfig,
                                                 resolve_boost)
from precision_tool.session.boost.train_step import Boost

BOOST_PREFIX = "boost/"  # every op a boost algorithm adds is named under it

__all__ = ["ALGORITHMS", "BOOST_LEVELS", "BOOST_MODES", "BOOST_PREFIX", "DEFAULTS", "Boost", "BoostConfig",
           "resolve_boost"]

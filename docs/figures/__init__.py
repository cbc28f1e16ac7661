"""The docs' figures: every name a figure block may call (`docs/render.py`)."""

from figures.core import *  # noqa: F403
from figures.heddle import *  # noqa: F403
from figures.plexrl import *  # noqa: F403
from figures.rollmux import *  # noqa: F403
from figures.rose import *  # noqa: F403
from figures.served import *  # noqa: F403
from figures.services import *  # noqa: F403
from figures.tangram import *  # noqa: F403

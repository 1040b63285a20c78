"""`Stateful`: what an object learned while training, saved and restored apart from its settings."""
from __future__ import annotations

import copy
from typing import Any


class Stateful:
    """Checkpoints save ``state_dict()`` and a resumed run calls ``load_state_dict()``.

    ``STATE`` names the attributes that change as training goes (a policy's current bound, a
    filter's residuals); every other attribute is a setting and comes from the constructor, so a
    job may resume with other settings. Attributes that are Stateful themselves are saved whole
    under their name. Values are plain Python and numpy (the caller converts for its format).
    """

    STATE: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        state = {name: copy.deepcopy(getattr(self, name)) for name in self.STATE}
        state.update({name: value.state_dict() for name, value in vars(self).items() if isinstance(value, Stateful)})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in self.STATE if name not in state]
        if missing:
            raise ValueError(f"{type(self).__name__} state lacks {', '.join(missing)}: not a state of this class")
        for name in self.STATE:
            setattr(self, name, copy.deepcopy(state[name]))
        for name, value in vars(self).items():
            if isinstance(value, Stateful) and name in state:
                value.load_state_dict(state[name])

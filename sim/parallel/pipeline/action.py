"""A pipeline action: (stage, kind, microbatch), written as torch does ("2F5" = stage 2, forward, microbatch 5).
Kinds: F forward, B full backward, I input-gradient backward, W weight-gradient backward (schedules.py)."""
from __future__ import annotations

import re
from typing import NamedTuple

_ACTION_RE = re.compile(r"(\d+)([FBIW])(\d+)$")


class Action(NamedTuple):
    stage: int
    kind: str        # F, B, I, W
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @staticmethod
    def parse(text: str) -> "Action | None":
        m = _ACTION_RE.match(text.strip())
        return Action(int(m.group(1)), m.group(2), int(m.group(3))) if m else None

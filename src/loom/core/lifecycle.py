"""What starts and stops (a server, a process, a group of them) used as a context manager:
`with X(...) as x:` starts it and stops it on the way out, an exception included."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Started"]


class Started(ABC):
    """`start()` on entering a `with` block (what it returns is bound), `stop()` on leaving."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

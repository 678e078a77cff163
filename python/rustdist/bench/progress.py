"""A progress bar on stderr: one line redrawn in place on a terminal, plain lines otherwise
(a log file gets one line per step)."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Optional, TextIO


class Progress:
    """`total` steps; `update` moves it, `print` writes a stdout line without breaking the bar."""

    def __init__(self, total: int, stream: Optional[TextIO] = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.label = ""
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._start = time.monotonic()
        self._shown = False
        self._plain_label: Optional[str] = None
        self._drawn_at = 0  # whole seconds shown by the last draw

    def update(self, done: Optional[int] = None, label: Optional[str] = None) -> None:
        """Sets the steps done and/or what runs now, and shows it."""
        if done is not None:
            self.done = min(done, self.total)
        if label is not None:
            self.label = label
        self._draw()

    def advance(self, label: Optional[str] = None) -> None:
        """One more step done."""
        self.update(self.done + 1, label)

    def tick(self) -> None:
        """Redraws the bar when its clock has moved on (a terminal only: plain lines come per
        step)."""
        if self._tty and self._shown and self._elapsed() != self._drawn_at:
            self._draw()

    def print(self, line: str) -> None:
        """Prints `line` on stdout; on a terminal the bar is cleared first and drawn again
        below it."""
        self._clear()
        print(line, flush=True)
        if self._tty and self._shown:
            self._draw()

    def close(self) -> None:
        """Removes the bar (on a terminal)."""
        self._clear()
        self._shown = False

    def _elapsed(self) -> int:
        return int(time.monotonic() - self._start)

    def _tail(self) -> str:
        elapsed = self._elapsed()
        return f" {self.done}/{self.total} {elapsed // 60}:{elapsed % 60:02d} {self.label}"

    def text(self, width: int) -> str:
        """The bar as one line of at most `width` characters."""
        tail = self._tail()
        bar_width = max(10, min(40, width - len(tail) - 2))
        filled = bar_width * self.done // self.total
        return f"[{'#' * filled}{'.' * (bar_width - filled)}]{tail}"[:width]

    def _draw(self) -> None:
        self._shown = True
        self._drawn_at = self._elapsed()
        if self._tty:
            width = shutil.get_terminal_size().columns - 1
            self._stream.write(f"\r\033[K{self.text(width)}")
        elif self.label != self._plain_label:  # a plain line per new step, not per redraw
            self._plain_label = self.label
            self._stream.write(f"progress{self._tail()}\n")
        self._stream.flush()

    def _clear(self) -> None:
        if self._tty and self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()

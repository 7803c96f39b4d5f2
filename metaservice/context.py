"""What every service function needs besides its session: settings and the clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from metaservice.clock import Clock, SystemClock
from metaservice.contract import slot_of
from metaservice.settings import Settings
from metaservice.topology.graph import TopologyCache


@dataclass
class Context:
    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    graph: TopologyCache = field(default_factory=TopologyCache)

    @property
    def interval(self) -> int:
        return self.settings.barrier_interval_ms

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def now_slot(self) -> int:
        return slot_of(self.now_ms(), self.interval)

    @property
    def idle_advance(self) -> str:
        """``settings.idle_advance`` with ``auto`` resolved (see the setting)."""
        mode = self.settings.idle_advance
        if mode == "auto":
            return "background" if isinstance(self.clock, SystemClock) else "readers"
        return mode

    @property
    def readers_catch_up(self) -> bool:
        """Whether a consistent-version read raises the watermark and advances idle
        writers itself when they could move (no advancer runs)."""
        return self.idle_advance == "readers"

    def closed_slot(self) -> int:
        """The newest slot that has ended."""
        return self.now_slot() - self.interval

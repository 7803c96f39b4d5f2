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

    def closed_slot(self) -> int:
        """The newest slot that has ended."""
        return self.now_slot() - self.interval

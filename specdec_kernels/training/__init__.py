"""Asset builders above the decoding layer: self-distillation data from a frozen target and
the trainers of the drafters that learn from it (EAGLE-3 style feature drafter; Medusa heads
read the same data). The decoding layer never imports this package: what it loads (weights,
configs) is defined beside the drafters that use it."""

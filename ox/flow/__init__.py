"""Flow control: unique tasks (ox.flow.unique), per-queue and per-key concurrency and rate
limits (ox.flow.limits, enforced by the claim in ox.flow.gate), and pausing queues
(ox.flow.queues). Everything is decided by the database: a unique index for uniqueness, the
queue's row lock for limits, the claim statement for pauses."""

"""The agents plane: a manager and workers over NATS, scored, trained from, and audited into the store.

- `events`: the pydantic models of every event and the subjects they travel on;
- `server`, `bus`: the local nats-server the engine runs, and connecting to a plane (JetStream);
- `manager`, `worker`, `scoring`, `feedback`, `tasks`, `alarms`: the loop and how results are judged;
- `policy`, `trainer`: the model a worker serves, and training it from the plane's rollouts;
- `audit`, `plane`, `roles`, `cli`: the store's audit, the engine's supervision, the processes, `carl agents`.

Importing this package imports nothing heavy; each module brings its own dependencies.
"""

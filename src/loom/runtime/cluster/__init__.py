"""The cluster runtime (PlexRL §4–5): worker-process groups that execute a deployment's
operations (`wpg`); the tiny decoder they train in tests (`model`). Needs the torch extra."""

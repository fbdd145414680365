"""Where results go: the MLflow sink every run writes through (`sink`), its client (`mlflow_store`),
and the outbox that keeps records while the server is away and replays them (`outbox`)."""

"""The worker's entry point. The group's main model starts loading first, in a thread of its
own, before this process imports its service stack (FastStream, aiokafka, uvicorn: a second
or more): OpenVINO compiles the model (or torch reads it) beside those imports, the broker
connection and the group join (the app's lifespan adopts the load: state.ModelLoad)."""


def main() -> None:
    from evalstream.common import logs
    from evalstream.common.settings import WorkerSettings
    from evalstream.worker.engine_registry import main_model, shared_engines

    settings = WorkerSettings.from_env()
    logs.configure(settings.log_level, f"worker-{settings.worker_group}")  # the load's own lines
    if spec := main_model(settings.worker_model):
        shared_engines(settings).preload(spec)

    from evalstream.common import service
    from evalstream.worker.app import app

    service.run(app, settings)


if __name__ == "__main__":
    main()

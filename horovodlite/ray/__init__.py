"""horovodlite on Ray: ``RayExecutor`` (Horovod's ``horovod.ray`` API), each rank a Ray actor.

    import ray
    from horovodlite.ray import RayExecutor

    ray.init()
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()

    def train():
        import horovodlite.torch as hvd
        hvd.init()
        ...
        return hvd.rank()

    print(executor.run(train))    # [0, 1, 2, 3]: every rank's result, in rank order
    executor.shutdown()

Ray is imported when an executor is used, not on import of this module; without Ray the error
says how to install it. For Ray Train's ``TorchTrainer`` no executor is needed: ``hvd.init()``
in the training function reuses the process group Ray Train set up
(``examples/ray_torch_trainer.py``).
"""

from horovodlite.ray.executor import RayExecutor, RaySettings

__all__ = ["RayExecutor", "RaySettings"]

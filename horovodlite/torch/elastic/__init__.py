"""``hvd.elastic``: Horovod's elastic programming model.

Example::

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for batch_idx, batch in enumerate(loader):     # loader uses sampler=sampler
                ...                                         # forward, backward, step
                state.sampler.record_batch(batch_idx, batch_size)
                state.batch += 1
                if state.batch % 10 == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)

Scripts written for ``horovod.torch.elastic`` run unchanged, under ``horovodliterun --elastic``
(horovodliterun is the job's driver, without MPI), ``horovodliterun --elastic --mpi`` (the ranks
mpirun started plus those they spawn, on an MPI with ULFM) or torchrun. docs/elastic.md has the
details. What differs from Horovod, and why:

- ``run`` recovers from failures of collectives (a rank raised ``HorovodInternalError``, a
  mismatch, a stall turned into an error, a rank that called ``hvd.shutdown()``) and from ranks
  whose process died: horovodlite is re-initialised (on the survivors) and training resumes
  from the last step a survivor applied - at most the step in flight is lost, and ``commit()``
  copies nothing (``HOROVOD_ELASTIC_ROLLBACK=commit``: every rank rolls back to the last
  commit, as Horovod's did).
- ``check_host_updates()`` raises ``HostsUpdatedInterrupt`` when the host discovery script
  (``--host-discovery-script``) lists more slots than the job has ranks or no longer lists a
  host of the job; otherwise never. ``HostsUpdatedInterrupt`` raised by the script itself still
  re-synchronises without rolling back.
- ``run`` gives up after ``reset_limit`` resets in a row with no commit between them
  (``DEFAULT_RESET_LIMIT``, 5), so a failure that recurs before training can commit again ends
  the job instead of looping; failures spread over a long job do not add up. The job's total
  is the driver's ``horovodliterun --reset-limit`` (default: no limit, as horovodrun's).
- Under ``HOROVOD_ELASTIC_ROLLBACK=commit``, ``commit()`` is a barrier, so every rank's last
  commit is the same point of training; ``run`` returns only when every rank's function has
  returned.
- ``sync()`` sends rank 0's current state and makes it every rank's snapshot; snapshots of
  plain attributes are deep copies.
"""

from horovodlite.torch.elastic.runner import DEFAULT_RESET_LIMIT, run
from horovodlite.torch.elastic.sampler import ElasticSampler
from horovodlite.torch.elastic.state import ObjectState, State, TorchState

__all__ = ["run", "DEFAULT_RESET_LIMIT", "State", "ObjectState", "TorchState", "ElasticSampler"]

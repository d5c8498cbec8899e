"""getting_started.py: the tour of examples/getting_started.cpp, in Python.

One program drives a mesh of worker processes as if they were one machine:
  1. spawn procs (worker processes of this host) and an actor on each,
  2. call them all (ValueMesh), reduce inside the cast tree, call one, choose one,
  3. slice the mesh and broadcast to a slice,
  4. lose a proc and handle the MeshFailure in the owner's __supervise__; the rest keeps working.

Run it after a build:  PYTHONPATH=build/python /usr/bin/python3 examples/python/getting_started.py
The workers run `python3 -m monarch._worker`; the classes below, defined in __main__, travel to
them by value (cloudpickle).
"""

import os

from monarch.actor import Actor, context, endpoint, this_host, this_proc


# An actor: its @endpoint methods can be called from other processes.
class Worker(Actor):
    def __init__(self, base: int):
        self.base = base

    @endpoint
    def value(self, x: int) -> int:
        # message_rank: this member's rank in the view the message was cast to.
        return self.base + x + context().message_rank.rank

    @endpoint
    def hello(self, who: str) -> str:
        return "hello %s from pid %d" % (who, os.getpid())

    @endpoint
    def add(self, x: int) -> None:
        self.base += x

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)  # simulates a crashing process


# The owner of the proc mesh: failures of its procs arrive in its __supervise__.
class Controller(Actor):
    def __init__(self):
        self.seen = None  # the last failure handled, as text
        self.waiting = None  # the port of a next_failure() call not answered yet

    # Spawns the procs (and a Worker on each) from inside this actor, which makes it their owner.
    # The actor keeps the ProcMesh: the procs live as long as it holds them.
    @endpoint
    def start(self):
        self.procs = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 2}, name="tour")
        return self.procs.spawn("worker", Worker, 100)  # an ActorMesh travels in the reply

    # Answers with the next failure this actor handled. The handler returns at once and answers
    # through its port later: __supervise__ runs as a message of this actor, so waiting here
    # would keep it from running.
    @endpoint(explicit_response_port=True)
    def next_failure(self, port) -> None:
        if self.seen is not None:
            port.send(self.seen)
        else:
            self.waiting = port

    @endpoint
    def stop_procs(self) -> None:
        self.procs.stop().get(timeout=30)

    def __supervise__(self, failure) -> bool:
        self.seen = str(failure)
        if self.waiting is not None:
            self.waiting.send(self.seen)
            self.waiting = None
        return True  # handled: the other ranks keep working


def main():
    # The controller runs in this process; the procs it spawns are its children.
    controller = this_proc().spawn("controller", Controller)
    workers = controller.start.call_one().get(timeout=60)
    print("1. %d procs, extent %s" % (len(workers), workers.extent))

    values = workers.value.call(1).get(timeout=10)  # a ValueMesh over the extent
    print("2. call:      " + " ".join(str(v) for v in values.values()))
    print("   reduce:    sum = %d (one reply, reduced in the cast tree)"
          % workers.value.reduce("sum", 1).get(timeout=10))
    one = workers.slice(replicas=1, gpus=0)  # slicing drops the dims: one member
    print("   call_one:  " + one.hello.call_one("main").get(timeout=10))
    print("   choose:    %d" % workers.value.choose(0).get(timeout=10))

    replica1 = workers.slice(replicas=1)
    replica1.add.broadcast(1000)  # fire and forget, to a slice
    after = replica1.value.call(0).get(timeout=10)  # FIFO per sender: sees the add
    print("3. broadcast to replicas=1, then call: %d %d" % tuple(after.values()))

    workers.slice(replicas=1, gpus=1).exit_now.broadcast(3)
    print("4. __supervise__(): " + controller.next_failure.call_one().get(timeout=30))
    rest = workers.slice(replicas=0).value.call(0).get(timeout=10)
    print("   replicas=0 still answers: %d %d" % tuple(rest.values()))
    everyone = workers.value.call(0).get(timeout=10)  # the dead rank holds its error
    failed = everyone.failed_ranks()
    print("   call to all: %d answered, rank %s failed; survivors(): sum = %d"
          % (len(everyone) - len(failed), " ".join(map(str, failed)),
             workers.survivors().value.reduce("sum", 0).get(timeout=10)))

    controller.stop_procs.call_one().get(timeout=40)  # the owner stops its procs
    print("done")


if __name__ == "__main__":
    main()

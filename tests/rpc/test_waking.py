"""Changes announced from other threads wake the coroutines waiting on a loop; none is missed."""

from __future__ import annotations

import asyncio
import threading

from elasticps.rpc.waking import Changes


def test_a_notify_from_another_thread_wakes_every_waiter() -> None:
    changes, state = Changes(), {"version": 0}

    async def main() -> list[bool]:
        waiters = [changes.wait_for(lambda: state["version"] == 1, 30.0) for _ in range(200)]
        gathered = asyncio.gather(*waiters)
        await asyncio.sleep(0)  # every waiter registered

        def advance() -> None:
            state["version"] = 1
            changes.notify()

        threading.Thread(target=advance).start()
        return await gathered

    assert asyncio.run(main()) == [True] * 200
    assert changes.generation == 1


def test_a_change_before_the_wait_is_seen_and_a_wait_without_one_times_out() -> None:
    changes, state = Changes(), {"version": 1}
    changes.notify()  # no loop yet: nothing to wake, the state says it

    async def main() -> tuple[bool, bool]:
        return await changes.wait_for(lambda: state["version"] == 1, 30.0), await changes.wait_for(lambda: False, 0.01)

    assert asyncio.run(main()) == (True, False)


def test_a_notify_after_the_loop_closed_is_harmless() -> None:
    changes = Changes()
    asyncio.run(changes.wait_for(lambda: False, 0.0))
    changes.notify()
    assert changes.generation == 1

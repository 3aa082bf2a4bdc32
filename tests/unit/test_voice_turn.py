"""Which transcription of a user turn can serve as its final transcript."""

from __future__ import annotations

import asyncio

from gateway.realtime.voice import UserTurn


async def test_covering_jobs_reach_the_end_and_finish_first_first() -> None:
    async def never() -> None:
        await asyncio.Event().wait()

    early, late, cancelled, short_window = (asyncio.create_task(never()) for _ in range(4))
    turn = UserTurn(item_id="item_1", start=0, jobs=[(32_000, late, True), (16_000, early, True),
                                                     (40_000, cancelled, True), (48_000, short_window, False)])
    cancelled.cancel()
    await asyncio.sleep(0)
    assert turn.covering(16_000) == [early, late]  # sorted by how far their audio reaches
    assert turn.covering(20_000) == [late]  # a partial taken before the end of speech is not a final
    assert turn.covering(45_000) == []  # nor one decoded on the partials' shorter window
    for task in (early, late, short_window):
        task.cancel()
    await asyncio.gather(early, late, short_window, return_exceptions=True)

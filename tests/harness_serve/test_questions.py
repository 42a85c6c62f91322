"""ask_user over HTTP: the session view lists the open question; POST …/questions/{id} answers it (same auth)."""

from __future__ import annotations

from loopd.harness import Reply, SqliteJournal, ToolCall
from loopd.harness.models import ModelRequest
from loopd.harness.tools import AskUserTool
from tests.harness_serve.conftest import scripted_rig, serving
from tests.harness_serve.test_commands import wait_for_event


def asking_model(request: ModelRequest) -> Reply:
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        question = {"question": "Which port?", "choices": ["8080", "9090"]}
        return Reply(tool_calls=[ToolCall(id="ask-1", name="ask_user", arguments=question)])
    return Reply(text=f"using {results[-1].content}")


async def test_an_open_question_is_listed_and_answered_through_the_api(journal: SqliteJournal) -> None:
    rig = scripted_rig(journal, asking_model, tools=[AskUserTool()])
    async with serving(rig, token="s3cret") as served:
        created = (await served.client.post("/v1/sessions", json={"input": "start the server"})).json()
        sid = created["id"]
        asked = await wait_for_event(served, sid, "user_input_requested")
        assert asked["event"]["question"] == "Which port?" and asked["event"]["choices"] == ["8080", "9090"]
        view = (await served.client.get(f"/v1/sessions/{sid}")).json()
        assert [q["request_id"] for q in view["questions"]] == ["ask-1"]

        # The same bearer token as every other route: without it, nothing is answered.
        anonymous = await served.client.post(
            f"/v1/sessions/{sid}/questions/ask-1", json={"text": "9090"}, headers={"Authorization": ""}
        )
        assert anonymous.status_code == 401

        answered = await served.client.post(f"/v1/sessions/{sid}/questions/ask-1", json={"text": "9090"})
        assert answered.status_code == 202, answered.text
        assert answered.json() == {"request_id": "ask-1", "status": "accepted"}
        done = await wait_for_event(served, sid, "turn_done")
        assert done["event"]["text"] == "using The user answered: 9090"

        again = await served.client.post(f"/v1/sessions/{sid}/questions/ask-1", json={"text": "8080"})
        assert again.status_code == 404 and again.json()["error"]["type"] == "not_found"
        empty = await served.client.post(f"/v1/sessions/{sid}/questions/ask-1", json={"text": ""})
        assert empty.status_code == 400

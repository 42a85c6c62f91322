import { afterEach, describe, expect, it } from "vitest";
import type { JsonObject } from "../agentue";
import { HttpError, type MessageBody } from "../detail/http";
import { click, deferred, FakeApi, type Mounted, mount, press, type } from "../detail/testing";
import { CHOICES, gateMessage, questionMessage } from "./fixtures";
import { GateCard } from "./GateCard";
import { HarnessQuestionCard } from "./HarnessQuestionCard";
import { HumanCard } from "./HumanCard";
import { gateBlocks } from "./model";

const REPLIES = "/v1/conversations/c1/tasks/t1/replies";
let view: Mounted | null = null;
afterEach(() => {
  view?.unmount();
  view = null;
});

function answeredTo(message: MessageBody, patch: Record<string, unknown>): MessageBody {
  const [block] = (message.content["blocks"] ?? []) as JsonObject[];
  return { ...message, revision: message.revision + 1, content: { ...message.content, blocks: [{ ...block, ...(patch as JsonObject) }] } };
}

describe("HumanCard: ask", () => {
  it("answers with a choice, disabled while submitting, then read-only with the outcome", async () => {
    const message = questionMessage({ type: "ask", choices: CHOICES });
    const reply = deferred<unknown>();
    const api = new FakeApi().on("POST", REPLIES, () => reply.promise);
    const updates: MessageBody[] = [];
    view = await mount(<HumanCard message={message} api={api} onUpdate={(m) => updates.push(m)} />);
    const card = view.one("ask-card");
    expect(card.dataset["state"]).toBe("pending");
    expect(view.byTestId("ask-free-text")).toHaveLength(0);
    expect((view.one("card-submit") as HTMLButtonElement).disabled).toBe(true); // nothing chosen yet
    await click(view.byTestId("ask-choice")[1] as HTMLElement);
    await click(view.one("card-submit"));
    expect(card.dataset["state"]).toBe("submitting");
    expect((view.one("card-submit") as HTMLButtonElement).disabled).toBe(true);
    expect((view.one("card-dismiss") as HTMLButtonElement).disabled).toBe(true);
    expect(api.calls).toEqual([
      { method: "POST", path: REPLIES, body: { reply_to_message_id: "q1", outcome: "success", value: "blue" } },
    ]);
    const stored = answeredTo(message, { status: "success", value: "blue" });
    reply.resolve({ status: "success", message: stored });
    await view.rerender(<HumanCard message={message} api={api} onUpdate={(m) => updates.push(m)} />);
    expect(view.one("ask-card").dataset["state"]).toBe("answered");
    expect(updates).toEqual([stored]);
    const radios = view.byTestId("ask-choice") as HTMLInputElement[];
    expect(radios.map((r) => [r.checked, r.disabled])).toEqual([
      [false, true],
      [true, true],
    ]);
    expect(view.one("card-outcome").textContent).toBe("Answered: Blue");
    expect(view.byTestId("card-submit")).toHaveLength(0);
  });

  it("answers free text when choices and free text are allowed; typing clears the choice", async () => {
    const api = new FakeApi().on("POST", REPLIES, (call) => ({
      message: answeredTo(questionMessage({ type: "ask", choices: CHOICES, allow_other: true }), {
        status: "success",
        value: (call.body as { value: string }).value,
      }),
    }));
    view = await mount(<HumanCard message={questionMessage({ type: "ask", choices: CHOICES, allow_other: true })} api={api} />);
    await click(view.byTestId("ask-choice")[0] as HTMLElement);
    await type(view.one("ask-free-text"), "  green  ");
    expect((view.byTestId("ask-choice")[0] as HTMLInputElement).checked).toBe(false);
    await click(view.one("card-submit"));
    expect(api.calls[0]?.body).toEqual({ reply_to_message_id: "q1", outcome: "success", value: "green" });
    expect(view.one("ask-card").dataset["state"]).toBe("answered");
    expect((view.one("ask-free-text") as HTMLTextAreaElement).value).toBe("green");
    expect((view.one("ask-free-text") as HTMLTextAreaElement).readOnly).toBe(true);
  });

  it("keeps the input and shows the error when the reply fails, then retries", async () => {
    let fail = true;
    const message = questionMessage({ type: "ask", allow_other: true });
    const api = new FakeApi().on("POST", REPLIES, () => {
      if (fail) throw new HttpError(0, "network", "offline");
      return { message: answeredTo(message, { status: "success", value: "my words" }) };
    });
    view = await mount(<HumanCard message={message} api={api} />);
    expect(view.byTestId("ask-choice")).toHaveLength(0);
    await type(view.one("ask-free-text"), "my words");
    await click(view.one("card-submit"));
    expect(view.one("ask-card").dataset["state"]).toBe("pending");
    expect(view.one("card-error").textContent).toContain("Could not reach the server");
    expect((view.one("ask-free-text") as HTMLTextAreaElement).value).toBe("my words");
    expect((view.one("card-submit") as HTMLButtonElement).disabled).toBe(false);
    fail = false;
    await click(view.one("card-submit"));
    expect(view.byTestId("card-error")).toHaveLength(0);
    expect(view.one("ask-card").dataset["state"]).toBe("answered");
  });

  it("dismisses with the button and with Escape", async () => {
    const message = questionMessage({ type: "ask", choices: CHOICES });
    const api = new FakeApi().on("POST", REPLIES, () => ({ message: answeredTo(message, { status: "dismissed" }) }));
    view = await mount(<HumanCard message={message} api={api} />);
    await press(view.byTestId("ask-choice")[0] as HTMLElement, "Escape");
    expect(api.calls[0]?.body).toEqual({ reply_to_message_id: "q1", outcome: "dismissed" });
    expect(view.one("ask-card").dataset["state"]).toBe("dismissed");
    expect(view.one("card-outcome").textContent).toBe("Dismissed");
    await press(view.one("ask-card"), "Escape");
    expect(api.calls).toHaveLength(1); // terminal: Escape does nothing
  });

  it("shows the stored outcome after a conflict (answered elsewhere)", async () => {
    const message = questionMessage({ type: "ask", choices: CHOICES });
    const api = new FakeApi()
      .on("POST", REPLIES, () => {
        throw new HttpError(409, "conflict", "this question already has its outcome: success");
      })
      .on("GET", "/v1/human/q1", () => ({ message: answeredTo(message, { status: "success", value: "red" }) }));
    view = await mount(<HumanCard message={message} api={api} />);
    await click(view.one("card-dismiss"));
    expect(view.one("ask-card").dataset["state"]).toBe("answered");
    expect(view.one("card-error").textContent).toContain("already has its outcome");
  });

  it("renders a timed-out question read-only with its options, and follows a newer message prop", async () => {
    const message = questionMessage({ type: "ask", choices: CHOICES });
    const api = new FakeApi();
    view = await mount(<HumanCard message={message} api={api} />);
    await view.rerender(<HumanCard message={answeredTo(message, { status: "timeout" })} api={api} />);
    expect(view.one("ask-card").dataset["state"]).toBe("timeout");
    expect((view.byTestId("ask-choice") as HTMLInputElement[]).every((r) => r.disabled && !r.checked)).toBe(true);
    expect(view.one("card-outcome").textContent).toBe("Timed out without an answer");
    expect(api.calls).toHaveLength(0);
  });

  it("carries no input over to another question shown in its place", async () => {
    const api = new FakeApi();
    view = await mount(<HumanCard message={questionMessage({ type: "ask", allow_other: true })} api={api} />);
    await type(view.one("ask-free-text"), "half an answer");
    await view.rerender(<HumanCard message={questionMessage({ type: "ask", allow_other: true }, { id: "q2" })} api={api} />);
    expect((view.one("ask-free-text") as HTMLTextAreaElement).value).toBe("");
    expect(view.one("ask-card").dataset["messageId"]).toBe("q2");
  });

  it("labels every control", async () => {
    view = await mount(<HumanCard message={questionMessage({ type: "ask", choices: CHOICES, allow_other: true })} api={new FakeApi()} />);
    for (const input of view.root.querySelectorAll("input, textarea")) {
      expect(view.root.querySelector(`label[for="${input.id}"]`)?.textContent?.trim()).toBeTruthy();
    }
    expect(view.one("ask-card").getAttribute("aria-labelledby")).toBeTruthy();
  });
});

describe("HumanCard: confirm", () => {
  it("accepts under a custom label and shows the choice read-only", async () => {
    const message = questionMessage({ type: "confirm", confirm_label: "Ship it", decline_label: "Not yet" });
    const api = new FakeApi().on("POST", REPLIES, () => ({ message: answeredTo(message, { status: "success", value: "declined" }) }));
    view = await mount(<HumanCard message={message} api={api} />);
    expect(view.one("confirm-card").dataset["state"]).toBe("pending");
    expect(view.one("confirm-accept").textContent).toBe("Ship it");
    await click(view.one("confirm-decline"));
    expect(api.calls[0]?.body).toEqual({ reply_to_message_id: "q1", outcome: "success", value: "declined" });
    expect(view.one("confirm-card").dataset["state"]).toBe("answered");
    expect(view.byTestId("confirm-accept")).toHaveLength(0); // read-only: the options stay, as text
    const options = [...view.one("card-options").querySelectorAll("li")].map((li) => [li.textContent, li.dataset["chosen"]]);
    expect(options).toEqual([
      ["Ship it", "false"],
      ["✓ Not yet (chosen)", "true"],
    ]);
    expect(view.one("card-outcome").textContent).toBe("Answered: Not yet");
  });
});

describe("GateCard", () => {
  const gatePath = "/v1/harness/calls/call-1/gates/g-1";

  it("shows the summary to the asker and approves once", async () => {
    const message = gateMessage();
    const answer = deferred<unknown>();
    const api = new FakeApi().on("GET", "/v1/harness/calls/call-1", () => ({ id: "call-1", phase: "running" })).on("POST", gatePath, () => answer.promise);
    view = await mount(<GateCard message={message} block={gateBlocks(message)[0] ?? {}} api={api} />);
    expect(view.one("gate-card").dataset["state"]).toBe("pending");
    expect(view.one("gate-summary").textContent).toContain("rm -rf build");
    await click(view.one("gate-approve"));
    expect(view.one("gate-card").dataset["state"]).toBe("submitting");
    expect(["gate-approve", "gate-always", "gate-deny"].every((id) => (view?.one(id) as HTMLButtonElement).disabled)).toBe(true);
    answer.resolve({ call_id: "call-1", gate_id: "g-1", answer: "approve" });
    await view.rerender(<GateCard message={message} block={gateBlocks(message)[0] ?? {}} api={api} />);
    expect(view.one("gate-card").dataset["state"]).toBe("approved");
    expect(api.calls.at(-1)).toEqual({ method: "POST", path: gatePath, body: { answer: "approve" } });
    expect(view.one("card-outcome").textContent).toBe("Approved once");
    expect(view.byTestId("gate-approve")).toHaveLength(0);
  });

  it("renders nothing for someone the server hides the call from", async () => {
    const message = gateMessage();
    view = await mount(<GateCard message={message} block={gateBlocks(message)[0] ?? {}} api={new FakeApi()} />);
    expect(view.byTestId("gate-card")).toHaveLength(0);
  });

  it("keeps the controls after a failed answer, and shows a denied gate read-only", async () => {
    const message = gateMessage();
    const api = new FakeApi().on("POST", gatePath, () => {
      throw new HttpError(409, "conflict", "harness call call-1 is already failed");
    });
    view = await mount(<GateCard message={message} block={gateBlocks(message)[0] ?? {}} asker api={api} />);
    await click(view.one("gate-deny"));
    expect(view.one("gate-card").dataset["state"]).toBe("pending");
    expect(view.one("card-error").textContent).toContain("already failed");
    expect((view.one("gate-deny") as HTMLButtonElement).disabled).toBe(false);
    const denied = gateMessage({ status: "success", value: "deny" });
    await view.rerender(<GateCard message={denied} block={gateBlocks(denied)[0] ?? {}} asker api={api} />);
    expect(view.one("gate-card").dataset["state"]).toBe("denied");
    expect(view.byTestId("gate-deny")).toHaveLength(0);
    expect(view.one("card-options").querySelector('[data-chosen="true"]')?.getAttribute("data-value")).toBe("deny");
  });
});

describe("HarnessQuestionCard", () => {
  const path = "/v1/harness/calls/call-1/questions/ask-1";
  const block = {
    id: "question/ask-1",
    type: "ask",
    call_id: "call-1",
    title: "The harness asks",
    prompt: "Which region?",
    choices: [
      { value: "eu", label: "eu" },
      { value: "us", label: "us" },
    ],
    allow_other: true,
    status: "pending",
  };

  it("lets the asker pick a choice, then shows the answer", async () => {
    const message = gateMessage();
    const api = new FakeApi().on("GET", "/v1/harness/calls/call-1", () => ({ id: "call-1" })).on("POST", path, () => ({ request_id: "ask-1" }));
    view = await mount(<HarnessQuestionCard message={message} block={block} api={api} />);
    expect(view.one("harness-question").textContent).toBe("Which region?");
    await click(view.byTestId("harness-question-choice")[1] as HTMLElement);
    await view.rerender(<HarnessQuestionCard message={message} block={block} api={api} />);
    expect(api.calls.at(-1)).toEqual({ method: "POST", path, body: { text: "us" } });
    expect(view.one("card-outcome").textContent).toBe("Answered: us");
  });

  it("renders nothing for someone the server hides the call from, and a timed-out question read-only", async () => {
    const message = gateMessage();
    view = await mount(<HarnessQuestionCard message={message} block={block} api={new FakeApi()} />);
    expect(view.byTestId("harness-question-card")).toHaveLength(0);
    view.unmount();
    view = await mount(<HarnessQuestionCard message={message} block={{ ...block, status: "timeout" }} asker api={new FakeApi()} />);
    expect(view.one("card-outcome").textContent).toBe("No answer before the deadline");
    expect(view.byTestId("harness-question-choice")).toHaveLength(0);
  });
});

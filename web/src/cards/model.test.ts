// @vitest-environment node
import { describe, expect, it } from "vitest";
import { CHOICES, gateMessage, questionMessage } from "./fixtures";
import { askValue, cardState, gateBlocks, gateOf, gateState, newerMessage, outcomeText, questionOf } from "./model";

describe("questionOf", () => {
  it("reads an ask with choices and free text", () => {
    const q = questionOf(questionMessage({ type: "ask", choices: CHOICES, allow_other: true }));
    expect(q).toMatchObject({ type: "ask", allowOther: true, status: "pending", taskId: "t1", conversationId: "c1" });
    expect(q?.choices).toEqual([
      { value: "red", label: "Red" },
      { value: "blue", label: "Blue", description: "The calm one" },
    ]);
  });

  it("reads a confirm with custom labels, and defaults them", () => {
    const q = questionOf(questionMessage({ type: "confirm", confirm_label: "Ship it", decline_label: "Not yet" }));
    expect(q).toMatchObject({ type: "confirm", confirmLabel: "Ship it", declineLabel: "Not yet", choices: [] });
    expect(questionOf(questionMessage({ type: "confirm" }))).toMatchObject({ confirmLabel: "Confirm", declineLabel: "Decline" });
  });

  it("ignores malformed choices and unknown statuses, and finds no question in other content", () => {
    const q = questionOf(questionMessage({ type: "ask", choices: [{ label: "no value" }, "x", { value: "ok" }], status: "weird" }));
    expect(q?.choices).toEqual([{ value: "ok", label: "ok" }]);
    expect(q?.status).toBe("pending");
    const plain = questionMessage({ type: "text" });
    expect(questionOf(plain)).toBeNull();
  });
});

describe("states and values", () => {
  it("maps outcomes to card states, submitting only while pending", () => {
    expect(cardState({ status: "pending" }, false)).toBe("pending");
    expect(cardState({ status: "pending" }, true)).toBe("submitting");
    expect(cardState({ status: "success" }, true)).toBe("answered");
    expect(cardState({ status: "dismissed" }, false)).toBe("dismissed");
    expect(cardState({ status: "timeout" }, false)).toBe("timeout");
    expect(cardState({ status: "failure" }, false)).toBe("failed");
  });

  it("sends the chosen value, else trimmed free text only when allowed", () => {
    const q = { choices: CHOICES, allowOther: true };
    expect(askValue(q, "blue", "")).toBe("blue");
    expect(askValue(q, null, "  green ")).toBe("green");
    expect(askValue(q, null, "   ")).toBeNull();
    expect(askValue({ choices: CHOICES, allowOther: false }, null, "green")).toBeNull();
    expect(askValue(q, "purple", "")).toBeNull();
  });

  it("says the outcome with the choice's label", () => {
    const answered = questionOf(questionMessage({ type: "ask", choices: CHOICES, status: "success", value: "blue" }));
    expect(answered && outcomeText(answered)).toBe("Answered: Blue");
    const confirm = questionOf(questionMessage({ type: "confirm", confirm_label: "Ship it", status: "success", value: "accepted" }));
    expect(confirm && outcomeText(confirm)).toBe("Answered: Ship it");
    const timedOut = questionOf(questionMessage({ type: "ask", allow_other: true, status: "timeout" }));
    expect(timedOut && outcomeText(timedOut)).toBe("Timed out without an answer");
  });

  it("keeps the higher revision of one message", () => {
    const a = questionMessage({ type: "confirm" });
    const b = { ...a, revision: a.revision + 1 };
    expect(newerMessage(a, b)).toBe(b);
    expect(newerMessage(b, a)).toBe(b);
    expect(newerMessage(a, null)).toBe(a);
    expect(newerMessage(a, { ...b, id: "other" })).toBe(a);
  });
});

describe("gates", () => {
  it("finds gate blocks in harness messages only", () => {
    const message = gateMessage();
    expect(gateBlocks(message).map((b) => b["id"])).toEqual(["gate/g-1"]);
    expect(gateBlocks({ ...message, kind: "operator" })).toEqual([]);
    const gate = gateOf(gateBlocks(message)[0] ?? {});
    expect(gate).toMatchObject({ gateId: "g-1", callId: "call-1", status: "pending" });
    expect(gate.prompt).toContain("rm -rf build");
  });

  it("maps gate outcomes", () => {
    expect(gateState({ status: "pending", value: null }, true)).toBe("submitting");
    expect(gateState({ status: "success", value: "approve" }, false)).toBe("approved");
    expect(gateState({ status: "success", value: "always" }, false)).toBe("approved");
    expect(gateState({ status: "success", value: "deny" }, false)).toBe("denied");
    expect(gateState({ status: "timeout", value: null }, false)).toBe("timeout");
    expect(gateState({ status: "failure", value: null }, false)).toBe("failed");
  });
});

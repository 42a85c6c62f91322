// The mode control: shown only for a responder with modes, the conversation's mode over the responder's own,
// what a change sends, and a refused change shown as an error (the shown mode stays).
import { render } from "preact";
import { act } from "preact/test-utils";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { ActorBody } from "../api";
import { ModeControl, effectiveMode } from "./ModeControl";

const harness: ActorBody = {
  kind: "harness",
  key: "assistant",
  display_name: "Assistant",
  description: "",
  modes: ["build", "plan"],
  mode: "build",
};
const operator: ActorBody = { kind: "operator", key: "router", display_name: "Router", description: "" };

const roots: HTMLElement[] = [];
function mount(actor: ActorBody | undefined, mode: string | null, onChange: ((mode: string) => Promise<void>) | null): HTMLElement {
  const root = document.createElement("div");
  document.body.appendChild(root);
  roots.push(root);
  act(() => render(<ModeControl actor={actor} mode={mode} onChange={onChange} />, root));
  return root;
}

afterEach(() => {
  for (const root of roots.splice(0)) {
    render(null, root);
    root.remove();
  }
});

function select(root: HTMLElement): HTMLSelectElement | null {
  return root.querySelector<HTMLSelectElement>('[data-testid="mode-control"]');
}

describe("ModeControl", () => {
  it("is shown only for a responder with modes", () => {
    expect(select(mount(operator, null, async () => undefined))).toBeNull();
    expect(select(mount(undefined, null, async () => undefined))).toBeNull();
    expect(select(mount(harness, null, async () => undefined))).not.toBeNull();
  });

  it("shows the conversation's mode, else the responder's own marked as the default", () => {
    const own = select(mount(harness, null, async () => undefined)) as HTMLSelectElement;
    expect(own.value).toBe("build");
    expect([...own.options].map((o) => o.textContent)).toEqual(["build (default)", "plan"]);
    expect((select(mount(harness, "plan", async () => undefined)) as HTMLSelectElement).value).toBe("plan");
    expect(effectiveMode(harness, null)).toBe("build");
    expect(effectiveMode({ mode: null }, null)).toBeNull();
  });

  it("sends a change, and is disabled without a conversation", async () => {
    const onChange = vi.fn(async () => undefined);
    const control = select(mount(harness, null, onChange)) as HTMLSelectElement;
    await act(async () => {
      control.value = "plan";
      control.dispatchEvent(new Event("change", { bubbles: true }));
    });
    expect(onChange).toHaveBeenCalledWith("plan");
    expect((select(mount(harness, null, null)) as HTMLSelectElement).disabled).toBe(true);
  });

  it("shows a refused change as an error", async () => {
    const root = mount(harness, null, async () => {
      throw new Error("not yours");
    });
    const control = select(root) as HTMLSelectElement;
    await act(async () => {
      control.value = "plan";
      control.dispatchEvent(new Event("change", { bubbles: true }));
    });
    expect(root.querySelector('[data-testid="mode-error"]')?.textContent).toBe("not yours");
  });
});

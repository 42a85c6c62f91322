/**
 * Test helpers of the W2 views (used by *.test.tsx only): mount into happy-dom, flush effects, and `FakeApi`, an
 * in-memory `Api` whose routes the test answers (at once, or later through a deferred reply).
 * Must not do: ship in the page (nothing outside tests imports it).
 */

import { type ComponentChild, render } from "preact";
import { act } from "preact/test-utils";
import { type Api, HttpError } from "./http";

export interface Mounted {
  readonly root: HTMLElement;
  rerender(node: ComponentChild): Promise<void>;
  unmount(): void;
  byTestId(id: string): HTMLElement[];
  one(id: string): HTMLElement;
}

/** Render `node` into a fresh element attached to the document. */
export async function mount(node: ComponentChild): Promise<Mounted> {
  const root = document.createElement("div");
  document.body.appendChild(root);
  await act(() => {
    render(node, root);
  });
  await flush();
  const byTestId = (id: string) => [...root.querySelectorAll<HTMLElement>(`[data-testid="${id}"]`)];
  return {
    root,
    rerender: async (next) => {
      await act(() => {
        render(next, root);
      });
      await flush();
    },
    unmount: () => {
      render(null, root);
      root.remove();
    },
    byTestId,
    one: (id) => {
      const found = byTestId(id);
      if (found.length !== 1) throw new Error(`expected one [data-testid=${id}], found ${found.length}`);
      return found[0] as HTMLElement;
    },
  };
}

/** Let pending promises and Preact's effects run. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i += 1) {
    await act(async () => {
      await new Promise((resolve) => setTimeout(resolve, 0));
    });
  }
}

/** Click an element inside act, then flush. */
export async function click(element: Element): Promise<void> {
  await act(() => {
    (element as HTMLElement).click();
  });
  await flush();
}

/** Type `text` into an input or textarea (fires `input`). */
export async function type(element: Element, text: string): Promise<void> {
  await act(() => {
    const field = element as HTMLTextAreaElement;
    field.value = text;
    field.dispatchEvent(new Event("input", { bubbles: true }));
  });
  await flush();
}

/** Press a key on an element (keydown, bubbling). */
export async function press(element: Element, key: string): Promise<void> {
  await act(() => {
    element.dispatchEvent(new KeyboardEvent("keydown", { key, bubbles: true, cancelable: true }));
  });
  await flush();
}

export interface Call {
  readonly method: "GET" | "POST";
  readonly path: string;
  readonly body: unknown;
}

type Handler = (call: Call) => unknown;

/** An in-memory server: `on(method, path or prefix*, handler)`; a handler returns a value, throws `HttpError`, or
 * returns a promise (e.g. `deferred().promise`) to keep the call in flight. Unknown routes answer 404. */
export class FakeApi implements Api {
  readonly calls: Call[] = [];
  private readonly routes: { method: string; path: string; handler: Handler }[] = [];

  on(method: "GET" | "POST", path: string, handler: Handler): this {
    this.routes.unshift({ method, path, handler });
    return this;
  }

  private async answer<T>(call: Call): Promise<T> {
    this.calls.push(call);
    const route = this.routes.find(
      (r) => r.method === call.method && (r.path.endsWith("*") ? call.path.startsWith(r.path.slice(0, -1)) : r.path === call.path),
    );
    if (!route) throw new HttpError(404, "not_found", `no route ${call.method} ${call.path}`);
    return (await route.handler(call)) as T;
  }

  get<T>(path: string): Promise<T> {
    return this.answer({ method: "GET", path, body: undefined });
  }

  post<T>(path: string, body: unknown): Promise<T> {
    return this.answer({ method: "POST", path, body });
  }
}

/** A promise the test settles by hand. */
export function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void; reject: (error: unknown) => void } {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

// The responders for the picker, from GET /v1/actors, refreshed every 10 s while the page is visible.
// Must not do: pick one (the composer does).
import { useEffect, useState } from "preact/hooks";
import { type ActorBody, listActors } from "../api";

export const ACTOR_REFRESH_MS = 10_000;

export function useActors(): { actors: ActorBody[]; loaded: boolean; error: string | null } {
  const [actors, setActors] = useState<ActorBody[]>([]);
  const [loaded, setLoaded] = useState(false);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const load = async () => {
      try {
        const list = await listActors(controller.signal);
        if (controller.signal.aborted) return;
        setActors((before) => (sameActors(before, list.data) ? before : list.data));
        setLoaded(true);
        setError(null);
      } catch (failure) {
        if (!controller.signal.aborted) setError(failure instanceof Error ? failure.message : String(failure));
      }
      if (!controller.signal.aborted) timer = setTimeout(tick, ACTOR_REFRESH_MS);
    };
    const tick = () => {
      if (typeof document !== "undefined" && document.visibilityState === "hidden") {
        timer = setTimeout(tick, ACTOR_REFRESH_MS);
        return;
      }
      void load();
    };
    void load();
    return () => {
      controller.abort();
      clearTimeout(timer);
    };
  }, []);
  return { actors, loaded, error };
}

function sameActors(a: ActorBody[], b: ActorBody[]): boolean {
  return a.length === b.length && a.every((x, i) => x.kind === b[i]?.kind && x.key === b[i]?.key && x.display_name === b[i]?.display_name);
}

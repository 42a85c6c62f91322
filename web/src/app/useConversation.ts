// One open conversation: load the snapshot, follow the live stream from its cursor (resume on drops), batch frames
// per animation frame, reload the snapshot when a frame cannot be applied. Switching conversations ends the visit:
// its fetches and stream abort and its late callbacks are dropped (a generation token), so nothing from an
// earlier visit reaches a later one. Must not do: render.
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError, followStream, type Generation, Generations, getSnapshot, type MessageBody, streamUrl } from "../api";
import type { StreamFrame } from "../api";
import { FrameBatcher } from "../chat/batch";
import type { Connection } from "../chat/status";
import { type ConversationView, applyFrames, emptyView, fromBody, mergeMessages, mergeSnapshot } from "../chat/store";

export interface ConversationState {
  view: ConversationView | null;
  connection: Connection;
  error: string | null;
  /** Merge server bodies (a chat request's answer, a card's reply) into the view. */
  mergeBodies: (bodies: MessageBody[], asOf: number | null) => void;
}

async function snapshotWithRetry(id: string, generation: Generation) {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await getSnapshot(id, generation.signal);
    } catch (error) {
      if (!(error instanceof ApiError) || !error.retryable || !generation.current || attempt >= 5) throw error;
      await new Promise((resolve) => setTimeout(resolve, Math.min(8000, 500 * 2 ** attempt)));
      if (!generation.current) throw error;
    }
  }
}

/** Follow `conversationId` (null: nothing open). */
export function useConversation(conversationId: string | null): ConversationState {
  const [view, setView] = useState<ConversationView | null>(null);
  const [connection, setConnection] = useState<Connection>("idle");
  const [error, setError] = useState<string | null>(null);
  const generations = useRef(new Generations());
  const current = useRef<Generation | null>(null);
  const reloading = useRef(false);

  useEffect(() => {
    const generation = generations.current.next();
    current.current = generation;
    setView(conversationId === null ? null : emptyView(conversationId));
    setError(null);
    if (conversationId === null) {
      setConnection("idle");
      return () => generations.current.end();
    }
    setConnection("connecting");
    const applyBatch = generation.guard((frames: StreamFrame[]) => {
      setView((before) => (before === null || before.conversationId !== conversationId ? before : applyFrames(before, frames)));
    });
    const batcher = new FrameBatcher<StreamFrame>(applyBatch);
    const setStatus = generation.guard((status: string, failure?: ApiError) => {
      if (status === "open") setConnection("open");
      else if (status === "reconnecting") setConnection("reconnecting");
      else if (status === "connecting") setConnection("connecting");
      else if (status === "failed") {
        setConnection("failed");
        setError(failure?.message ?? "the conversation stream failed");
      }
    });
    const mergeSnap = generation.guard((snapshot: Awaited<ReturnType<typeof getSnapshot>>) => {
      setView((before) => mergeSnapshot(before ?? emptyView(conversationId), snapshot));
    });
    const fail = generation.guard((failure: unknown) => {
      setConnection("failed");
      setError(failure instanceof Error ? failure.message : String(failure));
    });
    (async () => {
      try {
        const snapshot = await snapshotWithRetry(conversationId, generation);
        if (!generation.current) return;
        mergeSnap(snapshot);
        await followStream({
          url: streamUrl(conversationId),
          cursor: snapshot.cursor,
          signal: generation.signal,
          onFrame: (frame) => {
            if (generation.current) batcher.push(frame);
          },
          onStatus: setStatus,
          onCursorAhead: async () => {
            const fresh = await getSnapshot(conversationId, generation.signal);
            mergeSnap(fresh);
            return fresh.cursor;
          },
        });
      } catch (failure) {
        if (!(failure instanceof ApiError && failure.type === "aborted")) fail(failure);
      }
    })();
    return () => {
      batcher.cancel();
      generations.current.end();
    };
  }, [conversationId]);

  // A frame that could not be applied: reload the snapshot (once at a time, for this visit only).
  const stale = view?.stale === true;
  useEffect(() => {
    const generation = current.current;
    if (!stale || conversationId === null || generation === null || reloading.current) return;
    reloading.current = true;
    getSnapshot(conversationId, generation.signal)
      .then(
        generation.guard((snapshot) => setView((before) => mergeSnapshot(before ?? emptyView(conversationId), snapshot))),
        () => undefined,
      )
      .finally(() => {
        reloading.current = false;
      });
  }, [stale, conversationId]);

  const mergeBodies = useCallback((bodies: MessageBody[], asOf: number | null) => {
    const generation = current.current;
    if (generation === null || !generation.current) return;
    setView((before) => (before === null ? before : mergeMessages(before, bodies.map((body) => fromBody(body, asOf)))));
  }, []);

  return { view, connection, error, mergeBodies };
}

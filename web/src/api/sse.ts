// An incremental parser of the text/event-stream format (the parts loopd uses: id, event, data, comments). Pure.
// Must not do: I/O or JSON parsing (the caller decides what a message means).

/** One SSE message: `id` (null when the message had none), `event` ("message" by default) and joined `data`. */
export interface SseMessage {
  id: string | null;
  event: string;
  data: string;
}

/** Feed text chunks in; complete messages come out. Lines may end in \n, \r\n or \r; chunks may split anywhere. */
export class SseParser {
  private buffer = "";
  private pendingCR = false;
  private id: string | null = null;
  private event = "";
  private data: string[] = [];
  private hasData = false;

  /** Parse `chunk` and return the messages it completed. */
  push(chunk: string): SseMessage[] {
    const out: SseMessage[] = [];
    let text = chunk;
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1); // the \n of a \r\n split across chunks
    this.pendingCR = false;
    let start = 0;
    const all = this.buffer + text;
    this.buffer = "";
    for (let index = 0; index < all.length; index += 1) {
      const char = all.charCodeAt(index);
      if (char !== 10 && char !== 13) continue;
      this.line(all.slice(start, index), out);
      if (char === 13) {
        if (index + 1 < all.length) {
          if (all.charCodeAt(index + 1) === 10) index += 1;
        } else {
          this.pendingCR = true;
        }
      }
      start = index + 1;
    }
    this.buffer = all.slice(start);
    return out;
  }

  private line(line: string, out: SseMessage[]): void {
    if (line === "") {
      if (this.hasData) out.push({ id: this.id, event: this.event || "message", data: this.data.join("\n") });
      this.id = null;
      this.event = "";
      this.data = [];
      this.hasData = false;
      return;
    }
    if (line.startsWith(":")) return; // a comment (heartbeat)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") {
      this.data.push(value);
      this.hasData = true;
    } else if (field === "id") {
      if (!value.includes("\0")) this.id = value;
    } else if (field === "event") {
      this.event = value;
    }
  }
}

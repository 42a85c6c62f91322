// @vitest-environment node
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiError, apiJson } from "./http";

let server: Server;
let base = "";

beforeAll(async () => {
  server = createServer((req, res) => {
    if (req.url === "/ok") {
      res.writeHead(200, { "Content-Type": "application/json" }).end('{"hello":"world"}');
    } else if (req.url === "/missing") {
      res.writeHead(404, { "Content-Type": "application/json" }).end('{"error":{"type":"not_found","message":"no such conversation"}}');
    } else if (req.url === "/plain") {
      res.writeHead(502).end("bad gateway");
    } else if (req.url === "/slow") {
      setTimeout(() => res.writeHead(200).end("{}"), 2000);
    } else {
      res.writeHead(500).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

describe("apiJson", () => {
  it("returns the parsed body", async () => {
    expect(await apiJson(`${base}/ok`)).toEqual({ hello: "world" });
  });

  it("turns the error envelope into a typed ApiError", async () => {
    const error = await apiJson(`${base}/missing`).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error).toMatchObject({ status: 404, type: "not_found", message: "no such conversation" });
    expect((error as ApiError).retryable).toBe(false);
  });

  it("falls back to the status when there is no envelope", async () => {
    const error = (await apiJson(`${base}/plain`).catch((e: unknown) => e)) as ApiError;
    expect(error.status).toBe(502);
    expect(error.retryable).toBe(true);
  });

  it("a timeout and an unreachable server are ApiErrors", async () => {
    const slow = (await apiJson(`${base}/slow`, { timeoutMs: 100 }).catch((e: unknown) => e)) as ApiError;
    expect(slow.type).toBe("timeout");
    const closed = (await apiJson("http://127.0.0.1:9/x").catch((e: unknown) => e)) as ApiError;
    expect(closed.type).toBe("network");
    expect(closed.status).toBe(0);
  });
});

// @vitest-environment node
import { describe, expect, it } from "vitest";
import { hashConversation } from "./App";

describe("hashConversation", () => {
  it("reads #c=<id>", () => {
    expect(hashConversation("#c=0190abc")).toBe("0190abc");
    expect(hashConversation("#c=a%2Fb")).toBe("a/b");
    expect(hashConversation("")).toBeNull();
    expect(hashConversation("#other")).toBeNull();
  });
});

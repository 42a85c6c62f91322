import { describe, expect, it } from "vitest";

import { authorLabel, authorPart } from "./author";

const report = (author: unknown, kind = "operator", key = "longhorizon") => ({
  kind,
  key,
  content: { version: "1.1", biz: "loopd.longhorizon", meta: { author }, blocks: [] },
});

describe("authorPart", () => {
  it("names the part of the operator that wrote the message", () => {
    expect(authorPart(report("operator/longhorizon/manager"))).toBe("manager");
    expect(authorPart(report("operator/longhorizon/auditor"))).toBe("auditor");
    expect(authorLabel(report("operator/longhorizon/executor"), "LongHorizon")).toBe("LongHorizon · executor");
  });

  it("ignores a part of another author, of a non-operator, or a malformed one", () => {
    expect(authorPart(report("operator/router/manager"))).toBeNull();
    expect(authorPart(report("operator/longhorizon/manager", "harness", "longhorizon"))).toBeNull();
    expect(authorPart(report("operator/longhorizon/"))).toBeNull();
    expect(authorPart(report("operator/longhorizon/a/b"))).toBeNull();
    expect(authorPart(report(42))).toBeNull();
    expect(authorPart({ kind: "operator", key: "longhorizon", content: null })).toBeNull();
    expect(authorLabel(report(undefined), "LongHorizon")).toBe("LongHorizon");
  });
});

/// <reference types="vitest/config" />
// Vite build of the loopd web UI: one page, output into the Python package so `loopd up` serves it (no CDN).
import { fileURLToPath } from "node:url";
import preact from "@preact/preset-vite";
import { defineConfig } from "vite";

const outDir = fileURLToPath(new URL("../src/loopd/server/webui/dist", import.meta.url));

export default defineConfig({
  plugins: [preact({ prerender: { enabled: false } })],
  base: "/",
  build: {
    outDir,
    emptyOutDir: true,
    assetsDir: "assets",
    sourcemap: false,
    // Everything is bundled: no external host, no inline script (the server's CSP is default-src 'self').
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    target: "es2022",
  },
  test: {
    environment: "happy-dom",
    include: ["src/**/*.test.ts", "src/**/*.test.tsx"],
    testTimeout: 20000,
  },
});

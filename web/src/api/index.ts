// The page's HTTP client: typed routes, the error envelope as ApiError, the SSE stream with resume, generations.
export * from "./types";
export * from "./http";
export * from "./sse";
export * from "./stream";
export * from "./generation";
export * from "./client";

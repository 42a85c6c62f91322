// The AgentUE protocol for the page: model validation, events, the reducer (same rules as loopd.agentue).
export * from "./model";
export * from "./events";
export * from "./reducer";

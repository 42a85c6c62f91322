// The detail panel (W2): W1 mounts <DetailPanel taskId running conversationId renderMessage /> in the right pane.
export { DefaultMessage, DetailPanel, type DetailPanelProps, mergeMessages } from "./DetailPanel";
export { actorLabel, layoutMessages, messageActor, messageInterval, parallelGroups } from "./parallel";

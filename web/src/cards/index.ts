// Human and gate cards (W2): what W1 mounts in the chat and the detail panel.
export { GateCard, type GateCardProps } from "./GateCard";
export { HarnessQuestionCard, type HarnessQuestionCardProps, isHarnessQuestionBlock } from "./HarnessQuestionCard";
export { HumanCard, type HumanCardProps } from "./HumanCard";
export { gateBlocks, isGateBlock, isHumanRequest, questionOf } from "./model";

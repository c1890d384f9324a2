export { Client, VERSION } from "./client.js";
export { HeraldError, AUTO_TRANSPORTS } from "./options.js";
export type { ClientEvents, ClientOptions, ClientState, HistoryOptions, PresenceOptions } from "./options.js";
export { Subscription } from "./subscription.js";
export type { Publication, SubscribedContext, SubscriptionEvents, SubscriptionOptions, SubscriptionState } from "./subscription.js";
export type { TransportName } from "./transport/types.js";
export type { Position } from "./cursor.js";
export { encodeCursor, decodeCursor } from "./cursor.js";
export { backoffDelay } from "./backoff.js";
export { shouldReconnect, ClientCode } from "./codes.js";
export type {
  HistoryResult,
  Member,
  PresenceResult,
  PresenceStatsResult,
  PublishOptions,
  PublishResult,
  PublicationData,
  RpcResult,
  Sender,
} from "./protocol.js";

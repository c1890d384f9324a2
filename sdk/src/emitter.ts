/** A small typed event emitter: `on` returns the function that removes the listener. */

export class Emitter<Events extends { [K in keyof Events]: unknown }> {
  private listeners = new Map<keyof Events, Set<(ctx: never) => void>>();

  on<K extends keyof Events>(event: K, listener: (ctx: Events[K]) => void): () => void {
    let set = this.listeners.get(event);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(listener as (ctx: never) => void);
    return () => this.off(event, listener);
  }

  once<K extends keyof Events>(event: K, listener: (ctx: Events[K]) => void): () => void {
    const off = this.on(event, (ctx) => {
      off();
      listener(ctx);
    });
    return off;
  }

  off<K extends keyof Events>(event: K, listener: (ctx: Events[K]) => void): void {
    this.listeners.get(event)?.delete(listener as (ctx: never) => void);
  }

  /** Listeners' exceptions are reported, never allowed to break the client's own state. */
  protected emit<K extends keyof Events>(event: K, ctx: Events[K]): void {
    const set = this.listeners.get(event);
    if (set === undefined) return;
    for (const listener of [...set]) {
      try {
        (listener as (ctx: Events[K]) => void)(ctx);
      } catch (error) {
        setTimeout(() => {
          throw error;
        });
      }
    }
  }
}

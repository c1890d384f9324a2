//! What every decoder target is, and the runtime the async ones block on.

/// A decoder: takes one input, must not panic.
pub type Decoder = Box<dyn FnMut(&[u8])>;

/// A runtime on the caller's thread, for decoders that are async.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

//! The generic relay ([`herald_broker::relay::Partition`]) in front of a [`RedisServer`].

use super::RedisServer;

/// The relay in front of one Redis; it runs as long as the test.
#[derive(Debug)]
pub struct Partition(herald_broker::relay::Partition);

impl Partition {
    /// Starts relaying a free loopback port to `redis`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(redis: &RedisServer) -> Self {
        Self(herald_broker::relay::Partition::start_to(redis.port()))
    }

    /// `redis://127.0.0.1:PORT` through the relay.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.0.port())
    }
}

impl std::ops::Deref for Partition {
    type Target = herald_broker::relay::Partition;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

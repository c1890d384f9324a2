//! Where `herald serve` gets its configuration: defaults, then the TOML file, then
//! `HERALD_*` environment variables, then flags; later sources win.

use figment::{
    providers::{Env, Format, Serialized, Toml},
    value::{Dict, Map},
    Figment, Metadata, Profile, Provider,
};
use herald_server::{config::LogFormat, Config};
use serde::{Deserialize, Serialize};

use crate::{
    cli::ServeArgs,
    storage::{BrokerConfig, NatsConfig, RedisConfig, ServeConfig, StorageEngine, MOVED_TO_BROKER},
};

/// Environment variables starting with `HERALD_` that are not configuration keys.
const NOT_CONFIG: &[&str] = &["url", "config"];

#[derive(Serialize)]
struct Flags<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<std::net::SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<&'a std::path::Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<UrlFlag<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nats: Option<UrlFlag<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    reuse_port: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sync: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_level: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    allowed_origins: &'a [String],
}

#[derive(Serialize)]
struct UrlFlag<'a> {
    url: &'a str,
}

/// The top-level keys the binary reads to build the engine (see [`crate::storage`]); the
/// server's configuration is everything else, and refuses keys it does not know.
const ENGINE_KEYS: &[&str] = &["storage", "redis", "nats", "broker"];

/// A source with only the engine's keys (`engine`), or only the rest. Each source keeps its
/// own name, so an error still says which file or variable a bad value came from.
struct Part<P> {
    source: P,
    engine: bool,
}

impl<P: Provider> Provider for Part<P> {
    fn metadata(&self) -> Metadata {
        self.source.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = self.source.data()?;
        for dict in data.values_mut() {
            dict.retain(|key, _| ENGINE_KEYS.contains(&key.as_str()) == self.engine);
        }
        Ok(data)
    }
}

/// The engine's settings, as read (the server's are read on their own).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineConfig {
    #[serde(default)]
    storage: StorageEngine,
    #[serde(default)]
    redis: RedisConfig,
    #[serde(default)]
    nats: NatsConfig,
    #[serde(default)]
    broker: BrokerConfig,
}

/// Reads every source into one [`ServeConfig`]; errors name the key and the source.
pub fn load(args: &ServeArgs) -> anyhow::Result<ServeConfig> {
    // Built-in namespaces are not merged key by key with the configuration's: a namespace
    // the configuration names is its own whole, and keys it leaves out take `[channels]`'
    // values, as for any namespace (added back below only when the configuration does not
    // name them).
    let built_in = Config::default().namespaces;
    let server: Config = sources(args, false).extract().map_err(invalid)?;
    let engine: EngineConfig = sources(args, true).extract().map_err(invalid)?;
    let mut config = ServeConfig {
        storage: engine.storage,
        redis: engine.redis,
        nats: engine.nats,
        broker: engine.broker,
        server,
    };
    for (name, rules) in built_in {
        config.server.namespaces.entry(name).or_insert(rules);
    }
    Ok(config)
}

/// Defaults, then the TOML file, then `HERALD_*` variables, then flags: the engine's keys
/// only (`engine`), or only the rest.
fn sources(args: &ServeArgs, engine: bool) -> Figment {
    let defaults = ServeConfig {
        server: Config {
            namespaces: Default::default(),
            ..Config::default()
        },
        ..ServeConfig::default()
    };
    let mut figment = Figment::from(Part {
        source: Serialized::defaults(defaults),
        engine,
    });
    if let Some(path) = &args.config {
        figment = figment.merge(Part {
            source: Toml::file_exact(path),
            engine,
        });
    }
    let flags = Flags {
        listen: args.listen,
        api_key: args.api_key.as_deref(),
        workers: args.workers,
        data_dir: args.data_dir.as_deref(),
        storage: args.storage.as_deref(),
        redis: args.redis_url.as_deref().map(|url| UrlFlag { url }),
        nats: args.nats_url.as_deref().map(|url| UrlFlag { url }),
        reuse_port: args.reuse_port,
        sync: args.sync.as_deref(),
        log_level: args.log_level.as_deref(),
        log_format: args.log_format.as_deref(),
        allowed_origins: &args.allowed_origin,
    };
    figment
        .merge(Part {
            source: Env::prefixed("HERALD_").split("__").ignore(NOT_CONFIG),
            engine,
        })
        .merge(Part {
            source: Serialized::defaults(flags),
            engine,
        })
}

fn invalid(errors: figment::Error) -> anyhow::Error {
    let mut message = String::from("invalid configuration:");
    for e in errors {
        // Figment names keys by profile ("default.client.x"); users write "client.x".
        let text = e.to_string().replace("key \"default.", "key \"");
        message.push_str(&format!("\n  {text}"));
        if let Some(key) = MOVED_TO_BROKER
            .iter()
            .find(|k| text.contains(&format!("\"redis.{k}\"")))
        {
            message.push_str(&format!(
                " (it moved to [broker], as it serves every remote engine: broker.{key})"
            ));
        }
    }
    anyhow::anyhow!(message)
}

/// Starts structured logging at the configured level.
pub fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .map_err(|e| anyhow::anyhow!("invalid configuration: `log_level`: {e}"))?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

//! Where `herald serve` gets its configuration: defaults, then the TOML file, then
//! `HERALD_*` environment variables, then flags; later sources win.

use figment::{
    providers::{Env, Format, Serialized, Toml},
    Figment,
};
use herald_server::{config::LogFormat, Config};
use serde::Serialize;

use crate::cli::ServeArgs;

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
    redis: Option<RedisFlags<'a>>,
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
struct RedisFlags<'a> {
    url: &'a str,
}

/// Reads every source into one [`Config`]; errors name the key and the source.
pub fn load(args: &ServeArgs) -> anyhow::Result<Config> {
    // Built-in namespaces are not merged key by key with the configuration's: a namespace
    // the configuration names is its own whole, and keys it leaves out take `[channels]`'
    // values, as for any namespace (added back below only when the configuration does not
    // name them).
    let built_in = Config::default().namespaces;
    let defaults = Config {
        namespaces: Default::default(),
        ..Config::default()
    };
    let mut figment = Figment::from(Serialized::defaults(defaults));
    if let Some(path) = &args.config {
        figment = figment.merge(Toml::file_exact(path));
    }
    figment = figment
        .merge(Env::prefixed("HERALD_").split("__").ignore(NOT_CONFIG))
        .merge(Serialized::defaults(Flags {
            listen: args.listen,
            api_key: args.api_key.as_deref(),
            workers: args.workers,
            data_dir: args.data_dir.as_deref(),
            storage: args.storage.as_deref(),
            redis: args.redis_url.as_deref().map(|url| RedisFlags { url }),
            reuse_port: args.reuse_port,
            sync: args.sync.as_deref(),
            log_level: args.log_level.as_deref(),
            log_format: args.log_format.as_deref(),
            allowed_origins: &args.allowed_origin,
        }));
    let mut config = figment.extract::<Config>().map_err(|e| {
        let mut message = String::from("invalid configuration:");
        for e in e {
            // Figment names keys by profile ("default.client.x"); users write "client.x".
            message.push_str(&format!(
                "\n  {}",
                e.to_string().replace("key \"default.", "key \"")
            ));
        }
        anyhow::anyhow!(message)
    })?;
    for (name, rules) in built_in {
        config.namespaces.entry(name).or_insert(rules);
    }
    Ok(config)
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

//! Fan-out over a range of publication sizes (study 4's large documents, study 5's growing
//! payloads): latency, throughput and CPU as messages grow.

use clap::Args;

use super::fanout::{self, FanoutArgs};
use crate::{client::Transport, report::Outcome, Common};

#[derive(Debug, Args, Clone)]
pub struct PayloadArgs {
    /// Publication sizes in bytes, comma-separated. Herald refuses publications over the
    /// namespace's `max_message_size` (64 KiB by default); for larger ones start it with e.g.
    /// `HERALD_CHANNELS__MAX_MESSAGE_SIZE=1048576` in the environment.
    #[arg(long, default_value = "64,2048,16384,60000")]
    pub sizes: String,
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    #[arg(long, default_value_t = 50)]
    pub publications: u64,
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    #[arg(long, default_value = "ws", value_parser = Transport::parse)]
    pub transport: Transport,
}

pub async fn run(args: PayloadArgs, common: &Common) -> anyhow::Result<Outcome> {
    let mut combined = Outcome {
        scenario: "payload".into(),
        ..Default::default()
    };
    for size in args.sizes.split(',') {
        let payload: usize = size.trim().parse()?;
        let o = fanout::once(
            FanoutArgs {
                subscribers: args.subscribers,
                channels: 1,
                publications: args.publications,
                rate: args.rate,
                publishers: 8,
                payload,
                transport: args.transport.clone(),
                connect_rate: 0.0,
            },
            common,
        )
        .await?;
        let mut table = o.tables.into_iter().next().expect("fanout makes one table");
        match combined.tables.first_mut() {
            Some(t) => t.rows.append(&mut table.rows),
            None => {
                table.title = format!(
                    "payload sizes: {} subscribers, {} publications at {}/s",
                    args.subscribers, args.publications, args.rate
                );
                combined.tables.push(table);
            }
        }
        combined.series.extend(
            o.series
                .into_iter()
                .map(|(n, p)| (format!("{n}-{payload}B"), p)),
        );
    }
    combined
        .notes
        .push("each size is a separate fan-out run against a fresh server".into());
    Ok(combined)
}

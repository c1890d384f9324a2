//! Results as a person or a machine wants them: a table on the terminal, JSON lines,
//! Markdown for reports, and SVG charts of what changed over time.

use std::{fmt::Write as _, path::Path};

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

/// One table of results.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Self {
        Self {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        self.rows.push(row);
    }
}

/// One moment of a run, for the charts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Point {
    pub t: f64,
    pub cpu_percent: f64,
    pub rss_mb: f64,
    pub connections: u64,
    pub received_per_s: f64,
    pub p99_ms: f64,
}

/// Everything a scenario produced.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub scenario: String,
    pub tables: Vec<Table>,
    /// How things were measured, and caveats.
    pub notes: Vec<String>,
    /// What changed over time, per run (a transport, say): one chart per metric, a line
    /// per run.
    pub series: Vec<(String, Vec<Point>)>,
    /// Comparisons: one picture each.
    #[serde(skip)]
    pub bars: Vec<Bars>,
}

/// Grouped bars: for each metric a panel, in it for each category (a transport) a bar per
/// source (this run, a study's published figure), each labelled with its value.
#[derive(Debug, Clone, Default)]
pub struct Bars {
    /// File name part.
    pub name: String,
    pub title: String,
    pub categories: Vec<String>,
    pub sources: Vec<String>,
    pub metrics: Vec<BarMetric>,
}

#[derive(Debug, Clone, Default)]
pub struct BarMetric {
    pub label: String,
    /// `values[source][category]`; None where a source has no figure.
    pub values: Vec<Vec<Option<f64>>>,
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => {
                if f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else if f.abs() >= 10.0 {
                    format!("{f:.1}")
                } else {
                    format!("{f:.2}")
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

pub fn text(outcome: &Outcome) -> String {
    let mut out = String::new();
    for t in &outcome.tables {
        let cells: Vec<Vec<String>> = t
            .rows
            .iter()
            .map(|r| r.iter().map(cell).collect())
            .collect();
        let widths: Vec<usize> = (0..t.columns.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                    .chain([t.columns[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let _ = writeln!(out, "\n{}", t.title);
        let line = |out: &mut String, items: &[String]| {
            let parts: Vec<String> = items
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i == 0 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            let _ = writeln!(out, "  {}", parts.join("  "));
        };
        line(&mut out, &t.columns);
        let _ = writeln!(
            out,
            "  {}",
            widths
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for r in &cells {
            line(&mut out, r);
        }
    }
    for n in &outcome.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    out
}

pub fn markdown(outcome: &Outcome) -> String {
    let mut out = format!("## {}\n", outcome.scenario);
    for t in &outcome.tables {
        let _ = writeln!(out, "\n**{}**\n", t.title);
        let _ = writeln!(out, "| {} |", t.columns.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(t.columns.len()));
        for r in &t.rows {
            let _ = writeln!(
                out,
                "| {} |",
                r.iter().map(cell).collect::<Vec<_>>().join(" | ")
            );
        }
    }
    if !outcome.notes.is_empty() {
        out.push('\n');
        for n in &outcome.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

/// One JSON object per table row (with the scenario and table title), then the notes.
pub fn json_lines(outcome: &Outcome) -> String {
    let mut out = String::new();
    for t in &outcome.tables {
        for r in &t.rows {
            let mut obj = serde_json::Map::new();
            obj.insert("scenario".into(), outcome.scenario.clone().into());
            obj.insert("table".into(), t.title.clone().into());
            for (k, v) in t.columns.iter().zip(r) {
                obj.insert(k.clone(), v.clone());
            }
            let _ = writeln!(out, "{}", Value::Object(obj));
        }
    }
    if !outcome.notes.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({"scenario": outcome.scenario, "notes": outcome.notes})
        );
    }
    out
}

/// A chart: file name part, axis label, and the value it plots.
type Metric = (&'static str, &'static str, fn(&Point) -> f64);

/// Colours of the runs (lines) and sources (bars), in order.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(150, 150, 150),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// A value as a label: as many decimals as its size needs (2.82, 0.046, 1,234 → 1234).
pub fn label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// An axis tick: the same decimals on every tick of an axis whose top is `top`.
fn tick(v: f64, top: f64) -> String {
    let decimals = if top >= 50.0 {
        0
    } else if top >= 5.0 {
        1
    } else if top >= 0.5 {
        2
    } else {
        3
    };
    format!("{v:.decimals$}")
}

fn file_name(dir: &Path, parts: &[&str]) -> std::path::PathBuf {
    let safe: String = parts
        .join("-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}.svg"))
}

/// The charts as SVG in `dir`: over time, one per metric with a line per run (metrics that
/// stayed at zero are left out), and each comparison of [`Outcome::bars`].
pub fn charts(outcome: &Outcome, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let runs: Vec<&(String, Vec<Point>)> = outcome
        .series
        .iter()
        .filter(|(_, p)| p.len() >= 2)
        .collect();
    let metrics: [Metric; 4] = [
        ("latency", "p99 latency (ms)", |p| p.p99_ms),
        ("connections", "connections", |p| p.connections as f64),
        ("cpu", "server CPU (% of one core)", |p| p.cpu_percent),
        ("memory", "server RSS (MB)", |p| p.rss_mb),
    ];
    for (slug, axis, get) in metrics {
        let y_top = runs
            .iter()
            .flat_map(|(_, points)| points.iter().map(get))
            .fold(0.0, f64::max);
        if runs.is_empty() || y_top <= 0.0 {
            continue;
        }
        let path = file_name(dir, &[&outcome.scenario, slug]);
        let t_max = runs
            .iter()
            .filter_map(|(_, p)| p.last().map(|p| p.t))
            .fold(1.0, f64::max);
        {
            let root = SVGBackend::new(&path, (800, 380)).into_drawing_area();
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{} · {axis}", outcome.scenario), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(0.0..t_max, 0.0..y_top * 1.1)?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc(axis)
                .y_label_formatter(&|v| tick(*v, y_top))
                .draw()?;
            for (i, (name, points)) in runs.iter().enumerate() {
                let colour = PALETTE[i % PALETTE.len()];
                chart
                    .draw_series(LineSeries::new(
                        points.iter().map(|p| (p.t, get(p))),
                        colour.stroke_width(2),
                    ))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
            root.present()?;
        }
        written.push(path);
    }
    for bars in &outcome.bars {
        let path = file_name(dir, &[&outcome.scenario, &bars.name]);
        draw_bars(bars, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// One SVG: a panel per metric, bars grouped by category, a colour per source, the value
/// above each bar, the category under each group.
fn draw_bars(bars: &Bars, path: &Path) -> anyhow::Result<()> {
    let panels = bars.metrics.len().max(1);
    let root = SVGBackend::new(path, (380 * panels as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(56);
    top.draw(&Text::new(bars.title.clone(), (12, 8), ("sans-serif", 18)))?;
    let mut x = 12;
    for (i, source) in bars.sources.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        top.draw(&Rectangle::new([(x, 34), (x + 14, 48)], colour.filled()))?;
        top.draw(&Text::new(source.clone(), (x + 20, 34), ("sans-serif", 14)))?;
        x += 30 + 8 * source.chars().count() as i32;
    }
    let n = bars.categories.len().max(1);
    let per_group = bars.sources.len().max(1) as f64;
    for (panel, metric) in body.split_evenly((1, panels)).iter().zip(&bars.metrics) {
        let y_top = metric
            .values
            .iter()
            .flatten()
            .flatten()
            .fold(0.0f64, |a, b| a.max(*b))
            .max(1e-9);
        // Below zero: room for the category names.
        let floor = -y_top * 0.12;
        let mut chart = ChartBuilder::on(panel)
            .caption(metric.label.clone(), ("sans-serif", 15))
            .margin(10)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..n as f64, floor..y_top * 1.15)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_label_formatter(&|v| {
                if *v < 0.0 {
                    String::new()
                } else {
                    tick(*v, y_top)
                }
            })
            .draw()?;
        for (c, category) in bars.categories.iter().enumerate() {
            chart.draw_series([Text::new(
                category.clone(),
                (c as f64 + 0.1, floor * 0.4),
                ("sans-serif", 13),
            )])?;
            for (s, values) in metric.values.iter().enumerate() {
                let Some(Some(v)) = values.get(c) else {
                    continue;
                };
                let width = 0.8 / per_group;
                let left = c as f64 + 0.1 + s as f64 * width;
                let colour = PALETTE[s % PALETTE.len()];
                chart.draw_series([Rectangle::new(
                    [(left, 0.0), (left + width * 0.9, *v)],
                    colour.filled(),
                )])?;
                chart.draw_series([Text::new(
                    label(*v),
                    (left, *v + y_top * 0.03),
                    ("sans-serif", 11),
                )])?;
            }
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn outcome() -> Outcome {
        let mut t = Table::new("fan-out", &["transport", "p99 ms", "loss"]);
        t.push(vec![json!("ws"), json!(3.25), json!(0)]);
        Outcome {
            scenario: "fanout".into(),
            tables: vec![t],
            notes: vec!["median of 3".into()],
            series: vec![(
                "ws".into(),
                (0..5)
                    .map(|i| Point {
                        t: i as f64,
                        p99_ms: i as f64,
                        connections: 10,
                        ..Default::default()
                    })
                    .collect(),
            )],
            bars: vec![Bars {
                name: "compare".into(),
                title: "two sources".into(),
                categories: vec!["ws".into(), "sse".into()],
                sources: vec!["this run".into(), "study".into()],
                metrics: vec![BarMetric {
                    label: "p99 ms".into(),
                    values: vec![vec![Some(2.82), Some(0.046)], vec![None, Some(31.0)]],
                }],
            }],
        }
    }

    #[test]
    fn renders_every_format() {
        let o = outcome();
        let text = text(&o);
        assert!(text.contains("transport  p99 ms  loss"), "{text}");
        assert!(text.contains("ws           3.25     0"), "{text}");
        let md = markdown(&o);
        assert!(
            md.contains("| transport | p99 ms | loss |\n|---|---|---|\n| ws | 3.25 | 0 |"),
            "{md}"
        );
        let line: Value = serde_json::from_str(json_lines(&o).lines().next().unwrap()).unwrap();
        assert_eq!(line["p99 ms"], 3.25);
        let dir = tempfile::tempdir().unwrap();
        let files = charts(&o, dir.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // CPU and memory stayed at zero: no empty charts for them.
        assert_eq!(
            names,
            [
                "fanout-latency.svg",
                "fanout-connections.svg",
                "fanout-compare.svg"
            ]
        );
        let latency = std::fs::read_to_string(&files[0]).unwrap();
        assert!(latency.contains("<svg"), "{latency}");
        // The axis says what the line shows: 0 to 4 ms, not 0.0 everywhere.
        assert!(latency.contains("\n2.00\n"), "{latency}");
        let bars = std::fs::read_to_string(&files[2]).unwrap();
        for value in ["2.82", "0.046", "31.0", "ws", "sse", "study"] {
            assert!(bars.contains(&format!("\n{value}\n")), "{value} in {bars}");
        }
    }
}

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
    pub series: Vec<(String, Vec<Point>)>,
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

/// Four charts per series (latency, connections, CPU, memory over time), as SVG in `dir`.
pub fn charts(outcome: &Outcome, dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (name, points) in &outcome.series {
        if points.len() < 2 {
            continue;
        }
        let metrics: [Metric; 4] = [
            ("latency", "p99 latency (ms)", |p| p.p99_ms),
            ("connections", "connections", |p| p.connections as f64),
            ("cpu", "server CPU (% of one core)", |p| p.cpu_percent),
            ("memory", "server RSS (MB)", |p| p.rss_mb),
        ];
        for (slug, label, get) in metrics {
            let safe: String = format!("{}-{name}-{slug}", outcome.scenario)
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let path = dir.join(format!("{safe}.svg"));
            let t_max = points.last().map_or(1.0, |p| p.t).max(1.0);
            let y_max = points.iter().map(get).fold(0.0, f64::max).max(1e-9) * 1.1;
            let file = path.clone();
            let root = SVGBackend::new(&file, (800, 360)).into_drawing_area();
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!("{} · {name} · {label}", outcome.scenario),
                    ("sans-serif", 18),
                )
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc(label)
                .draw()?;
            chart.draw_series(LineSeries::new(points.iter().map(|p| (p.t, get(p))), &BLUE))?;
            root.present()?;
            drop(chart);
            drop(root);
            written.push(path);
        }
    }
    Ok(written)
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
        assert_eq!(files.len(), 4);
        assert!(std::fs::read_to_string(&files[0]).unwrap().contains("<svg"));
    }
}

//! SVG plots with plotters' SVG backend (text is left to the viewer's
//! fonts, so no font files are needed to draw them): cycles per second
//! versus clients per backend, the handoff-gap distribution per backend,
//! and the `sessions` sweep.

use std::path::Path;

use plotters::prelude::*;

use crate::harness::{Measurement, Role, Workload};
use crate::report::{median_measurement, stat};
use crate::Results;

const PANEL: (u32, u32) = (640, 420);

fn color(index: usize, role: Role) -> RGBColor {
    const PEERS: [RGBColor; 4] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    const FLOORS: [RGBColor; 3] = [
        RGBColor(90, 90, 90),
        RGBColor(150, 150, 150),
        RGBColor(60, 60, 60),
    ];
    const OURS: [RGBColor; 2] = [RGBColor(214, 39, 40), RGBColor(255, 127, 14)];
    const VARIANTS: [RGBColor; 2] = [RGBColor(247, 129, 191), RGBColor(188, 189, 34)];
    match role {
        Role::Distlock => OURS[index % OURS.len()],
        Role::Variant => VARIANTS[index % VARIANTS.len()],
        Role::Floor => FLOORS[index % FLOORS.len()],
        Role::Peer => PEERS[index % PEERS.len()],
    }
}

/// Contenders of `backend`'s groups of `workload`, in first-seen order.
fn contenders(results: &Results, backend: &str, workload: Workload) -> Vec<(String, Role)> {
    let mut seen: Vec<(String, Role)> = Vec::new();
    for group in results
        .groups
        .iter()
        .filter(|g| g.backend == backend && g.workload == workload)
    {
        for c in &group.contenders {
            if !seen.iter().any(|(n, _)| n == &c.name) {
                seen.push((c.name.clone(), c.role));
            }
        }
    }
    seen
}

fn backends(results: &Results, workload: Workload) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for g in results.groups.iter().filter(|g| g.workload == workload) {
        if !seen.contains(&g.backend) {
            seen.push(g.backend.clone());
        }
    }
    seen
}

/// Colours: distlock red/orange, floors grey, peers blue/green/purple,
/// variants pink/olive.
fn colours(list: &[(String, Role)]) -> Vec<RGBColor> {
    let mut counts = [0usize; 4];
    list.iter()
        .map(|(_, role)| {
            let slot = match role {
                Role::Distlock => 0,
                Role::Floor => 1,
                Role::Peer => 2,
                Role::Variant => 3,
            };
            counts[slot] += 1;
            color(counts[slot] - 1, *role)
        })
        .collect()
}

pub fn all(results: &Results, out: &Path) {
    if let Err(error) = uncontended(results, &out.join("uncontended.svg")) {
        eprintln!("distlock-bench: uncontended plot: {error}");
    }
    if let Err(error) = handoff(results, &out.join("handoff.svg")) {
        eprintln!("distlock-bench: handoff plot: {error}");
    }
    if !results.sweeps.is_empty() {
        if let Err(error) = sweep(results, &out.join("sweep.svg")) {
            eprintln!("distlock-bench: sweep plot: {error}");
        }
    }
}

/// The `sessions` sweep: cycles/s (median, min–max) and cycle p99 against
/// the setting, one line per backend, two panels.
fn sweep(results: &Results, path: &Path) -> Result<(), Failure> {
    let root = SVGBackend::new(path, (PANEL.0 * 2, PANEL.1)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 2));
    let most = results
        .sweeps
        .iter()
        .flat_map(|s| s.sessions.iter().copied())
        .max()
        .unwrap_or(32) as f64;
    let clients = results.sweeps.first().map_or(16, |s| s.clients);
    let figures: [(&str, &str, Figure); 2] = [
        ("cycles/s", "cycles/s (median, min-max)", |m| m.ops_per_s),
        ("cycle p99 µs", "cycle p99 µs (median, min-max)", |m| {
            m.latency.p99_us
        }),
    ];
    for ((axis, caption, figure), panel) in figures.into_iter().zip(panels.iter()) {
        let series: Vec<Vec<(f64, f64, f64, f64)>> = results
            .sweeps
            .iter()
            .map(|sweep| {
                sweep
                    .sessions
                    .iter()
                    .filter_map(|&sessions| {
                        let s = stat(&sweep.group, sweep.contender(sessions)?, figure)?;
                        Some((sessions as f64, s.median, s.min, s.max))
                    })
                    .collect()
            })
            .collect();
        let top = series
            .iter()
            .flatten()
            .map(|&(_, _, _, hi)| hi)
            .fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{caption} vs sessions, {clients} clients"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((0.8f64..most * 1.25).log_scale(), 0f64..top * 1.1)?;
        mesh(&mut chart, "sessions (log scale)", axis, top)?;
        for (i, (sweep, points)) in results.sweeps.iter().zip(&series).enumerate() {
            medians_with_ranges(&mut chart, points, color(i, Role::Peer), &sweep.backend)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present()?;
    Ok(())
}

type Failure = Box<dyn std::error::Error>;

/// One figure of a measurement, as a panel plots it.
type Figure = fn(&Measurement) -> f64;

/// One contender's `(x, median, min, max)` points: the medians joined by a
/// line, each marked, with a bar from min to max, and its legend entry.
fn medians_with_ranges<'a, 'b: 'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    points: &[(f64, f64, f64, f64)],
    colour: RGBColor,
    label: &str,
) -> Result<(), Failure>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let line: Vec<(f64, f64)> = points.iter().map(|&(x, y, _, _)| (x, y)).collect();
    chart
        .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))?
        .label(label.to_owned())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
    chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    chart.draw_series(
        points.iter().map(|&(x, _, lo, hi)| {
            PathElement::new(vec![(x, lo), (x, hi)], colour.stroke_width(1))
        }),
    )?;
    Ok(())
}

/// The grid and axis labels of a plot of counts (x, whole numbers) against
/// a figure (y) whose largest value is `top` (thousands as `k` above
/// 10,000).
fn mesh<'a, 'b: 'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
    top: f64,
) -> Result<(), Failure>
where
    X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if top < 10_000.0 {
                format!("{y:.0}")
            } else {
                format!("{:.0}k", y / 1000.0)
            }
        })
        .draw()?;
    Ok(())
}

/// The legend box every plot draws, at `position`.
fn legend<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), Failure> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

fn grid(count: usize) -> (usize, usize) {
    let columns = if count > 1 { 2 } else { 1 };
    (count.div_ceil(columns).max(1), columns)
}

fn uncontended(results: &Results, path: &Path) -> Result<(), Failure> {
    let list = backends(results, Workload::Uncontended);
    let (rows, columns) = grid(list.len());
    let root = SVGBackend::new(path, (PANEL.0 * columns as u32, PANEL.1 * rows as u32))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((rows, columns));
    for (backend, panel) in list.iter().zip(panels.iter()) {
        let groups: Vec<_> = results
            .groups
            .iter()
            .filter(|g| &g.backend == backend && g.workload == Workload::Uncontended)
            .collect();
        let who = contenders(results, backend, Workload::Uncontended);
        let colours = colours(&who);
        let mut series: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); who.len()];
        let (mut top, mut most_clients) = (1.0f64, 1.0f64);
        for group in &groups {
            most_clients = most_clients.max(group.clients as f64);
            for (i, (name, _)) in who.iter().enumerate() {
                if let Some(s) = stat(group, name, |m| m.ops_per_s) {
                    top = top.max(s.max);
                    series[i].push((group.clients as f64, s.median, s.min, s.max));
                }
            }
        }
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{backend}: cycles/s vs clients (median, min-max)"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((0.8f64..most_clients * 1.25).log_scale(), 0f64..top * 1.1)?;
        mesh(&mut chart, "clients", "cycles/s", top)?;
        for (i, (name, _)) in who.iter().enumerate() {
            medians_with_ranges(&mut chart, &series[i], colours[i], name)?;
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    }
    root.present()?;
    Ok(())
}

fn handoff(results: &Results, path: &Path) -> Result<(), Failure> {
    let list = backends(results, Workload::Contended);
    let (rows, columns) = grid(list.len());
    let root = SVGBackend::new(path, (PANEL.0 * columns as u32, PANEL.1 * rows as u32))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((rows, columns));
    for (backend, panel) in list.iter().zip(panels.iter()) {
        let Some(group) = results
            .groups
            .iter()
            .find(|g| &g.backend == backend && g.workload == Workload::Contended)
        else {
            continue;
        };
        let who = contenders(results, backend, Workload::Contended);
        let colours = colours(&who);
        let curves: Vec<Vec<(f64, f64)>> = who
            .iter()
            .map(|(name, _)| {
                median_measurement(group, name)
                    .map(|m| {
                        m.latency
                            .curve
                            .iter()
                            .map(|&(q, us)| (us.max(1.0), q))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let longest = curves
            .iter()
            .flatten()
            .map(|&(us, _)| us)
            .fold(10.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{backend}: handoff gap, {} clients on one key (CDF)",
                    group.clients
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d((1f64..longest * 1.5).log_scale(), 0f64..1f64)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("gap (µs, log scale)")
            .y_desc("fraction of handoffs")
            .x_label_formatter(&|x| {
                if *x >= 1000.0 {
                    format!("{:.0} ms", x / 1000.0)
                } else {
                    format!("{x:.0}")
                }
            })
            .draw()?;
        for (i, (name, _)) in who.iter().enumerate() {
            let colour = colours[i];
            chart
                .draw_series(LineSeries::new(curves[i].clone(), colour.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

//! PNG plots of the reports: latency percentiles per system, and throughput against depth and
//! latency against throughput. Text needs a TrueType font; the DejaVu font Debian ships
//! (fonts-dejavu-core, which ops/test.sh installs) is looked for, and without one the plots are
//! skipped with a message.

use std::path::Path;

use plotters::prelude::*;

use crate::latency::LatencyCase;
use crate::throughput::Point;

pub(crate) const FONT_FILES: [&str; 2] =
    ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];

/// Registers a font for plot text once; `false` when none is found.
pub(crate) fn font_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        let Some(bytes) = FONT_FILES.iter().find_map(|path| std::fs::read(path).ok()) else {
            return false;
        };
        // The plotting library keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

const PERCENTILES: [(&str, usize); 6] = [("p50", 0), ("p90", 1), ("p99", 2), ("p99.9", 3), ("p99.99", 4), ("max", 5)];

fn percentiles(summary: &crate::report::Summary) -> [f64; 6] {
    [summary.p50, summary.p90, summary.p99, summary.p999, summary.p9999, summary.max].map(|ns| ns as f64 / 1000.0)
}

/// `latency-<poll>.png`: each case's percentiles, netdam solid and its floor dashed-grey.
pub fn latency(cases: &[LatencyCase], dir: &Path) -> Result<Vec<String>, String> {
    if !font_ready() {
        return Err(format!("no font for plot text (looked for {}): plots skipped", FONT_FILES.join(", ")));
    }
    let mut written = Vec::new();
    let mut polls: Vec<_> = cases.iter().map(|case| case.poll).collect();
    polls.dedup();
    for poll in polls {
        let chosen: Vec<&LatencyCase> =
            cases.iter().filter(|case| case.poll == poll && case.netdam.is_some()).collect();
        if chosen.is_empty() {
            continue;
        }
        let name = format!("latency-{}.png", poll.name());
        let path = dir.join(&name);
        let top = chosen
            .iter()
            .flat_map(|case| percentiles(&case.floor).into_iter().chain(percentiles(case.netdam.as_ref().unwrap())))
            .fold(1.0f64, f64::max);
        let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("Round-trip latency by percentile, {} polling (grey: UDP echo floor)", poll.name()),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0usize..5usize, (1.0f64..top * 1.5).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_labels(6)
            .x_label_formatter(&|x| PERCENTILES.get(*x).map(|(label, _)| label.to_string()).unwrap_or_default())
            .y_desc("µs (log scale)")
            .draw()
            .map_err(|e| e.to_string())?;
        for (index, case) in chosen.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let floor = percentiles(&case.floor);
            chart
                .draw_series(LineSeries::new((0..6).map(|x| (x, floor[x])), RGBColor(170, 170, 170).stroke_width(1)))
                .map_err(|e| e.to_string())?;
            let netdam = percentiles(case.netdam.as_ref().unwrap());
            chart
                .draw_series(LineSeries::new((0..6).map(|x| (x, netdam[x])), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("{} {} B", case.op, case.size))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
        written.push(name);
    }
    Ok(written)
}

/// `throughput.png` (operations/s against depth, netdam and floor) and
/// `throughput-latency.png` (p50 and p99 against operations/s).
pub fn throughput(points: &[Point], dir: &Path) -> Result<Vec<String>, String> {
    if !font_ready() {
        return Err(format!("no font for plot text (looked for {}): plots skipped", FONT_FILES.join(", ")));
    }
    if points.is_empty() {
        return Ok(Vec::new());
    }
    let path = dir.join("throughput.png");
    let max_depth = points.iter().map(|p| p.depth).max().unwrap_or(1) as f64;
    let top = points.iter().map(|p| p.floor_rate.max(p.ops_per_s)).fold(1.0f64, f64::max);
    let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Operations per second against requests in flight", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((1.0f64..max_depth * 1.2).log_scale(), 0.0f64..top * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("requests in flight per session")
        .y_desc("operations/s")
        .draw()
        .map_err(|e| e.to_string())?;
    let mut sessions: Vec<usize> = points.iter().map(|p| p.sessions).collect();
    sessions.sort_unstable();
    sessions.dedup();
    for (index, count) in sessions.iter().enumerate() {
        let series: Vec<&Point> = points.iter().filter(|p| p.sessions == *count).collect();
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(series.iter().map(|p| (p.depth as f64, p.ops_per_s)), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!("netdam, {count} session(s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|p| (p.depth as f64, p.floor_rate)),
                color.mix(0.4).stroke_width(1),
            ))
            .map_err(|e| e.to_string())?
            .label(format!("UDP echo floor, {count} session(s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.4).stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;

    let path = dir.join("throughput-latency.png");
    let right = points.iter().map(|p| p.ops_per_s).fold(1.0f64, f64::max);
    let top = points.iter().map(|p| p.p99_ns as f64 / 1000.0).fold(1.0f64, f64::max);
    let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("netdam latency against throughput (one point per depth)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0f64..right * 1.1, (1.0f64..top * 1.5).log_scale())
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("operations/s").y_desc("µs (log scale)").draw().map_err(|e| e.to_string())?;
    for (label, pick, index) in [("p50", 0usize, 0usize), ("p99", 1, 1)] {
        let color = Palette99::pick(index).to_rgba();
        let values: Vec<(f64, f64)> =
            points.iter().map(|p| (p.ops_per_s, if pick == 0 { p.p50_ns } else { p.p99_ns } as f64 / 1000.0)).collect();
        chart
            .draw_series(LineSeries::new(values.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(values.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(vec!["throughput.png".into(), "throughput-latency.png".into()])
}

/// `allreduce.png`: per buffer size, time against workers (left, log scale) and bytes on the wire
/// per worker (right); through the target solid, host-side dashed.
pub fn allreduce(points: &[crate::allreduce::PlotPoint], dir: &Path) -> Result<Vec<String>, String> {
    if !font_ready() {
        return Err(format!("no font for plot text (looked for {}): plots skipped", FONT_FILES.join(", ")));
    }
    if points.is_empty() {
        return Ok(Vec::new());
    }
    let name = "allreduce.png";
    let path = dir.join(name);
    let root = BitMapBackend::new(&path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(600);
    let mut sizes: Vec<u64> = points.iter().map(|p| p.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let most_workers = points.iter().map(|p| p.workers).max().unwrap_or(2) as f64;
    type Pick = fn(&crate::allreduce::PlotPoint) -> (f64, f64);
    let panels: [(_, &str, &str, bool, Pick); 2] = [
        (&left, "Time until every worker holds the sum", "ms (log scale)", true, |p| (p.target_ms, p.host_ms)),
        (&right, "Bytes on the wire per worker", "MiB (log scale)", false, |p| {
            (p.target_wire_bytes / f64::from(1u32 << 20), p.host_wire_bytes / f64::from(1u32 << 20))
        }),
    ];
    for (area, caption, unit, is_time, pick) in panels {
        let area: &DrawingArea<BitMapBackend, _> = area;
        let values = points.iter().flat_map(|p| {
            let (target, host) = pick(p);
            [target, host]
        });
        let (low, high) = values.fold((f64::MAX, 0.0f64), |(low, high), v| (low.min(v), high.max(v)));
        let low = (low * 0.7).max(if is_time { 0.01 } else { 0.001 });
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(1.5f64..most_workers + 0.5, (low..high * 1.5).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("worker processes")
            .y_desc(unit)
            .x_labels(8)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|e| e.to_string())?;
        for (index, bytes) in sizes.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let mut series: Vec<(f64, f64, f64)> = points
                .iter()
                .filter(|p| p.bytes == *bytes)
                .map(|p| {
                    let (target, host) = pick(p);
                    (f64::from(p.workers), target, host)
                })
                .collect();
            series.sort_by(|a, b| a.0.total_cmp(&b.0));
            let size = crate::allreduce::size_name(*bytes);
            chart
                .draw_series(LineSeries::new(series.iter().map(|s| (s.0, s.1)), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("{size}, through the target"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart
                .draw_series(series.iter().map(|s| Circle::new((s.0, s.1), 3, color.filled())))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(DashedLineSeries::new(series.iter().map(|s| (s.0, s.2)), 6, 4, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("{size}, host-side"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2)));
            chart
                .draw_series(series.iter().map(|s| TriangleMarker::new((s.0, s.2), 4, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(vec![name.to_string()])
}

//! Training-curve plots for the `kiln` command-line tool.
//!
//! [`write_training_curves`] draws two side-by-side panels into a PNG file:
//! the training loss against epoch progress (one point per optimiser step)
//! and the test accuracy measured at the end of each epoch.
//!
//! Text is rendered with DejaVu Sans, embedded in the binary from
//! `assets/DejaVuSans.ttf` (see `assets/DejaVu-LICENSE.txt`) and registered
//! with plotters' `ab_glyph` font backend, so plotting needs no system fonts,
//! fontconfig or font-kit: it works the same on a freshly installed machine.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// DejaVu Sans (Bitstream Vera derivative; free licence allowing
/// redistribution, see `assets/DejaVu-LICENSE.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// The family name every piece of text in the plots asks for.
const FONT: &str = "sans-serif";

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 520;

/// Register the embedded font under the name `"sans-serif"` (once per
/// process). plotters' own defaults (e.g. axis labels) also ask for
/// `"sans-serif"`, so every text element finds it.
fn ensure_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            // Other styles (bold, italic) fall back to the normal face.
            register_font(FONT, FontStyle::Normal, DEJAVU_SANS)
                .map_err(|_| "plot: the embedded DejaVu Sans font is invalid".to_string())
        })
        .clone()
}

/// Points with both coordinates finite (a diverged run may log NaN/inf
/// losses; they are left out rather than wrecking the axis ranges).
fn finite(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect()
}

/// `(min, max)` of the y values, widened so the range is never empty.
fn y_range(points: &[(f64, f64)]) -> (f64, f64) {
    let (mut lo, mut hi) =
        points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(_, y)| (lo.min(y), hi.max(y)));
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        let pad = if hi.abs() > 0.0 { hi.abs() * 0.1 } else { 1.0 };
        lo -= pad;
        hi += pad;
    }
    (lo, hi)
}

fn max_x(points: &[(f64, f64)]) -> f64 {
    points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max)
}

/// Draw the training curves of a run into a PNG at `path`.
///
/// * `loss_per_step`: `(epoch progress, loss)` pairs, where epoch progress is
///   fractional (`epoch + step / steps_per_epoch`), one per logged step.
/// * `test_accuracy_per_epoch`: `(epoch, accuracy)` pairs. Accuracies in
///   `[0, 1]` are plotted on a 0–100 % axis; larger values are taken to be
///   percentages already.
///
/// Non-finite points are skipped; an empty series leaves its panel with a
/// "no data" note instead of failing. The parent directory must exist.
/// Errors (unwritable path, encoding failure) are returned as messages naming
/// the file.
pub fn write_training_curves(
    path: &Path,
    title: &str,
    loss_per_step: &[(f64, f64)],
    test_accuracy_per_epoch: &[(f64, f64)],
) -> Result<(), String> {
    ensure_font()?;
    let fail = |e: &dyn std::fmt::Display| format!("plot: could not draw training curves into {}: {e}", path.display());

    let loss = finite(loss_per_step);
    let mut acc = finite(test_accuracy_per_epoch);
    // Fractions become percentages so the axis reads naturally.
    if acc.iter().all(|&(_, a)| (0.0..=1.0).contains(&a)) {
        for p in &mut acc {
            p.1 *= 100.0;
        }
    }

    // Both panels share the epoch axis so they line up by eye.
    // A little room on the right keeps the last marker and its label inside.
    let x_max = max_x(&loss).max(max_x(&acc)).max(1.0) * 1.03;

    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root.titled(title, (FONT, 26)).map_err(|e| fail(&e))?;
    let panels = root.split_evenly((1, 2));

    // Left: training loss.
    {
        let (lo, hi) = y_range(&loss);
        let pad = (hi - lo) * 0.05;
        let y_lo = if lo >= 0.0 { (lo - pad).max(0.0) } else { lo - pad };
        let mut chart = ChartBuilder::on(&panels[0])
            .caption("Training loss", (FONT, 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, y_lo..hi + pad)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc("loss")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .light_line_style(RGBColor(240, 240, 240))
            .x_max_light_lines(2)
            .y_max_light_lines(2)
            .draw()
            .map_err(|e| fail(&e))?;
        if loss.is_empty() {
            draw_no_data(&panels[0]).map_err(|e| fail(&e))?;
        } else {
            chart.draw_series(LineSeries::new(loss.iter().copied(), BLUE.stroke_width(2))).map_err(|e| fail(&e))?;
        }
    }

    // Right: test accuracy.
    {
        let (lo, _) = y_range(&acc);
        let y_hi = 100.0_f64.max(acc.iter().map(|p| p.1).fold(0.0, f64::max));
        // Zoom in on the interesting band: from a round 10 % below the
        // lowest accuracy up to 100 %.
        let y_lo = if acc.is_empty() { 0.0 } else { ((lo - 5.0) / 10.0).floor().max(0.0) * 10.0 };
        let mut chart = ChartBuilder::on(&panels[1])
            .caption("Test accuracy", (FONT, 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, y_lo..y_hi)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc("accuracy (%)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .light_line_style(RGBColor(240, 240, 240))
            .x_max_light_lines(2)
            .y_max_light_lines(2)
            .draw()
            .map_err(|e| fail(&e))?;
        if acc.is_empty() {
            draw_no_data(&panels[1]).map_err(|e| fail(&e))?;
        } else {
            let red = RGBColor(200, 40, 40);
            chart.draw_series(LineSeries::new(acc.iter().copied(), red.stroke_width(2))).map_err(|e| fail(&e))?;
            chart.draw_series(acc.iter().map(|&(x, y)| Circle::new((x, y), 4, red.filled()))).map_err(|e| fail(&e))?;
            // Label the last value: the number people look for.
            if let Some(&(x, y)) = acc.last() {
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{y:.2}%"),
                        (x, y),
                        (FONT, 15).into_font().color(&red).pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Right,
                            plotters::style::text_anchor::VPos::Bottom,
                        )),
                    )))
                    .map_err(|e| fail(&e))?;
            }
        }
    }

    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

fn draw_no_data<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        "no data",
        (w as i32 / 2 - 30, h as i32 / 2),
        (FONT, 18).into_font().color(&RGBColor(120, 120, 120)),
    ))
}

/// One panel: training loss per step (blue) and validation loss at each
/// evaluation (red, with markers), against the optimizer step — the
/// language-model counterpart of `write_training_curves`.
pub fn write_loss_curves(path: &Path, title: &str, train: &[(f64, f64)], val: &[(f64, f64)]) -> Result<(), String> {
    ensure_font()?;
    let fail = |e: &dyn std::fmt::Display| format!("plot: could not draw loss curves into {}: {e}", path.display());
    let (train, val) = (finite(train), finite(val));
    let both: Vec<(f64, f64)> = train.iter().chain(val.iter()).copied().collect();
    let (lo, hi) = y_range(&both);
    let pad = (hi - lo) * 0.05;
    let x_max = max_x(&both).max(1.0) * 1.03;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root.titled(title, (FONT, 26)).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, (lo - pad).max(0.0)..hi + pad)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss (nats/char)")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()
        .map_err(|e| fail(&e))?;
    if both.is_empty() {
        return draw_no_data(&root).map_err(|e| fail(&e));
    }
    chart
        .draw_series(LineSeries::new(train.iter().copied(), BLUE.stroke_width(1)))
        .map_err(|e| fail(&e))?
        .label("train")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    let red = RGBColor(200, 40, 40);
    chart
        .draw_series(LineSeries::new(val.iter().copied(), red.stroke_width(2)))
        .map_err(|e| fail(&e))?
        .label("validation")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
    chart.draw_series(val.iter().map(|&(x, y)| Circle::new((x, y), 4, red.filled()))).map_err(|e| fail(&e))?;
    chart
        .configure_series_labels()
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path in the system temp dir, unique to this process and name.
    fn tmp_png(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("kiln-plot-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn writes_a_valid_nontrivial_png() {
        let steps_per_epoch = 50;
        let epochs = 5;
        let loss: Vec<(f64, f64)> = (0..steps_per_epoch * epochs)
            .map(|s| {
                let t = s as f64 / steps_per_epoch as f64;
                (t, 2.3 * (-1.2 * t).exp() + 0.08 + 0.05 * ((s * 7919) % 13) as f64 / 13.0)
            })
            .collect();
        let acc: Vec<(f64, f64)> = (1..=epochs).map(|e| (e as f64, 0.97 - 0.4 * (-(e as f64)).exp())).collect();
        let path = tmp_png("curves.png");
        write_training_curves(&path, "MNIST MLP — training curves", &loss, &acc).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        assert!(bytes.len() > 10_000, "PNG suspiciously small: {} bytes", bytes.len());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn empty_and_degenerate_series_do_not_fail() {
        let path = tmp_png("empty.png");
        write_training_curves(&path, "empty", &[], &[]).unwrap();
        let path = tmp_png("flat.png");
        write_training_curves(&path, "flat", &[(0.0, 1.0), (1.0, 1.0), (2.0, f64::NAN)], &[(1.0, 0.5)]).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        std::fs::remove_file(tmp_png("empty.png")).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn embedded_font_lays_out_text() {
        ensure_font().unwrap();
        let (w, h) = (FONT, 20).into_font().box_size("epoch").unwrap();
        assert!(w > 20 && h > 10, "text box {w}x{h}");
        // A family nobody registered fails: text only renders through ours.
        assert!(("no-such-family", 20).into_font().box_size("x").is_err());
    }

    #[test]
    fn unwritable_path_is_an_error_naming_the_file() {
        let path = Path::new("/nonexistent-kiln-dir/x/curves.png");
        let err = write_training_curves(path, "t", &[(0.0, 1.0)], &[(1.0, 0.5)]).unwrap_err();
        assert!(err.contains("/nonexistent-kiln-dir/x/curves.png"), "{err}");
    }
}

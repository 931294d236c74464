//! `strftime_now(format)`, the date global of Llama 3 style templates
//! (`"Today Date: " + strftime_now("%d %b %Y")`). The time is UTC: the
//! standard library knows no local time zone, and a prompt's date should
//! not depend on where it is rendered.

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// The civil date of a day count since 1970-01-01: (year, month 1-12, day 1-31).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// `format` at `unix_secs` (UTC) with the C/Python directives `%Y %y %m %d
/// %e %j %H %I %M %S %p %b %B %a %A %Z %z %F %T %%`; a `-` after `%`
/// drops the zero padding (`%-d`). Other directives are refused by name.
pub fn strftime(format: &str, unix_secs: i64) -> Result<String, String> {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut d = chars.next();
        let pad = d != Some('-');
        if !pad {
            d = chars.next();
        }
        let num = |v: i64, width: usize| {
            if pad {
                format!("{v:0width$}")
            } else {
                v.to_string()
            }
        };
        let piece = match d {
            Some('Y') => year.to_string(),
            Some('y') => num(year.rem_euclid(100), 2),
            Some('m') => num(month.into(), 2),
            Some('d') => num(day.into(), 2),
            Some('e') => format!("{day:>2}"),
            Some('j') => num(yday.into(), 3),
            Some('H') => num(hour, 2),
            Some('I') => num((hour + 11) % 12 + 1, 2),
            Some('M') => num(minute, 2),
            Some('S') => num(second, 2),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.into(),
            Some('b') => month_name[..3].into(),
            Some('B') => month_name.into(),
            Some('a') => DAYS[weekday][..3].into(),
            Some('A') => DAYS[weekday].into(),
            Some('Z') => "UTC".into(),
            Some('z') => "+0000".into(),
            Some('F') => format!("{year}-{month:02}-{day:02}"),
            Some('T') => format!("{hour:02}:{minute:02}:{second:02}"),
            Some('%') => "%".into(),
            Some(other) => {
                return Err(format!(
                    "the directive %{other} is not supported (supported: %Y %y %m %d %e %j %H %I %M %S %p %b %B %a %A %Z %z %F %T %%)"
                ))
            }
            None => return Err("the format ends with a lone %".into()),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn dates_as_python_formats_them() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %p %j", t).unwrap(),
            "Thursday February 29, 24 13:05:09 PM 060"
        );
        assert_eq!(
            strftime("%F %T %I%%", t).unwrap(),
            "2024-02-29 13:05:09 01%"
        );
        assert_eq!(strftime("%d %b %Y %a", 0).unwrap(), "01 Jan 1970 Thu");
        // 2000-12-31: day 366 of a leap year.
        assert_eq!(strftime("%j %m/%d", 978_220_800).unwrap(), "366 12/31");
        assert!(strftime("%Q", t).unwrap_err().contains("%Q"));
        assert!(strftime("50%", t).is_err());
    }
}

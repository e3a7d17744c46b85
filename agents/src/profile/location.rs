//! Where in a TOML document an error is: line, column, and the dotted key of the entry.

/// Where a byte offset of a TOML document is, for located errors in other TOML files (the
/// daemon's config): 1-based line and character column, and the dotted key path of the
/// entry there, if the text parses as TOML at all.
pub fn toml_location(text: &str, offset: usize) -> (usize, usize, Option<String>) {
    let (line, column) = line_col(text, offset);
    (line, column, field_at(text, offset))
}

/// 1-based line and character column of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |idx| idx + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The dotted key path of the entry whose span contains `offset`, from a spanned parse of
/// the document. `None` when the text is not even TOML (then the error is file-level).
pub(super) fn field_at(text: &str, offset: usize) -> Option<String> {
    let document = toml::de::DeTable::parse(text).ok()?;
    let mut path = Vec::new();
    find_path(document.get_ref(), offset, &mut path);
    (!path.is_empty()).then(|| path.join("."))
}

fn find_path(table: &toml::de::DeTable<'_>, offset: usize, path: &mut Vec<String>) -> bool {
    for (key, value) in table {
        path.push(key.get_ref().to_string());
        // A `[table]`'s own span covers only its header, so look inside every table.
        if let toml::de::DeValue::Table(inner) = value.get_ref()
            && find_path(inner, offset, path)
        {
            return true;
        }
        let span = value.span();
        if key.span().contains(&offset) || span.contains(&offset) || span.end == offset {
            return true;
        }
        path.pop();
    }
    false
}

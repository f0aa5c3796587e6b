// The application icon. Qt on this platform may lack the SVG image plugin, so the same picture as
// resources/icons/traindeck.svg is also painted here; desktop environments use the SVG file.
#pragma once

#include <QIcon>

namespace td::ui {

QIcon appIcon();

}  // namespace td::ui

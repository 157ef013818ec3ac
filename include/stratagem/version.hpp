#pragma once
namespace stratagem {
inline constexpr const char* kVersion = STRATAGEM_VERSION;
}

// Entry point: mounts the loopd page into #app. Must not do: anything but mounting (the shell lives in app/).
import { render } from "preact";
import { App } from "./app/App";
import "./styles/app.css";

const root = document.getElementById("app");
if (root !== null) {
  render(<App />, root);
}

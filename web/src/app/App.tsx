// The page shell (three panes). Scaffold placeholder: filled in by W1 step 4.
export function App() {
  return (
    <main class="app">
      <h1>loopd</h1>
    </main>
  );
}
